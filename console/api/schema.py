"""The OpenAPI schema's account of errors: every operation documents the error answers it can
give, each with the body console.api.exceptions writes (the Error component).

One place adds them (REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]), so a new view is documented
without repeating them; a view's own `@extend_schema(responses=...)` for a status wins.
"""

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

# The body of every error answer of the API (console.api.exceptions.error_body). Built with
# type(): a field named `errors` is no attribute a Serializer class may declare.
ErrorSerializer = type(
    "ErrorSerializer",
    (serializers.Serializer,),
    {
        "__doc__": "The body of every error answer of the API.",
        "__module__": __name__,
        "code": serializers.CharField(
            help_text="Stable, for programs: e.g. validation_error, not_found."
        ),
        "message": serializers.CharField(help_text="For people: what was wrong and what to do."),
        "errors": serializers.JSONField(
            required=False,
            help_text="With code validation_error: the messages by field (a list of messages "
            "for the request as a whole).",
        ),
    },
)


# What each status means here, and the codes its body may carry.
BAD_REQUEST = (
    "Bad input; `code` says which: validation_error (the messages by field in `errors`; a "
    "date-time the database cannot compare is one), parse_error (a body that is not JSON), "
    "unknown_filter, empty_filter, invalid_id, invalid_cursor, request_too_large (a body over "
    "DATA_UPLOAD_MAX_MEMORY_SIZE), unknown_failure_group (a failure group with no rows), or "
    "the services' own codes (e.g. bulk_too_large, "
    "reason_required: a bulk action without a reason, invalid_window)."
)
ERROR_DESCRIPTIONS = {
    400: BAD_REQUEST,
    401: "No credentials, or credentials that are not valid (not_authenticated, "
    "authentication_failed): log in, or send `Authorization: Token <token>`.",
    403: "The user, or the token's scope, lacks the permission this operation needs "
    "(permission_denied).",
    404: "No such row (not_found).",
    406: "The Accept header names no media type the API can answer with (not_acceptable).",
    409: "The row's state does not allow this change (illegal_transition, "
    "invalid_transition, duplicate_event; operation_finished: a bulk operation that has "
    "ended cannot be cancelled): read it again and choose another action.",
    415: "The body's Content-Type is not one the operation reads "
    "(unsupported_media_type): send application/json.",
    429: "Too many requests (throttled); `Retry-After` says when to try again.",
}
# Every operation can answer these: bad input (a query parameter, a body too large),
# credentials, permissions, content negotiation, throttling.
COMMON_ERRORS = (400, 401, 403, 406, 429)


class ConsoleAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, plus the error answers of each operation.

    A view that names one object (a path parameter) may answer 404; one that reads a body, 415;
    a change of rows, 409, unless the view sets `state_conflicts = False` (its actions never
    refuse a row for its state).
    """

    def error_statuses(self) -> list[int]:
        statuses = list(COMMON_ERRORS)
        if "{" in self.path:
            statuses.append(404)
        if self.method in ("POST", "PUT", "PATCH"):
            statuses.append(415)
            if getattr(self.view, "state_conflicts", True):
                statuses.append(409)
        return sorted(statuses)

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        for status in self.error_statuses():
            if str(status) not in responses:
                responses[str(status)] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=ERROR_DESCRIPTIONS[status]),
                    str(status),
                    direction=direction,
                )
        return responses
