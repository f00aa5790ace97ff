"""One place that turns errors into the API's JSON: {"code": ..., "message": ...}.

The product's errors (outbox.errors, inbox.errors) carry a stable `code`; DRF's carry theirs.
"""

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from console.operations import ConsoleError, NotPermitted
from inbox.errors import InboxError
from outbox.errors import OutboxError

# Illegal state changes are conflicts with the row's current state; other product errors are
# bad input.
CONFLICT_CODES = frozenset(
    {"illegal_transition", "invalid_transition", "duplicate_event", "operation_finished"}
)


class ConsoleAPIError(exceptions.APIException):
    """An API error with its own code, e.g. raise ConsoleAPIError("too_many_ids", "...")."""

    status_code: int = status.HTTP_400_BAD_REQUEST

    def __init__(self, code: str, message: str, *, status_code: int | None = None) -> None:
        super().__init__(detail=message, code=code)
        if status_code is not None:
            self.status_code = status_code


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        return [
            line
            for key, value in detail.items()
            for line in _flatten(value, f"{prefix}{key}: " if key != "non_field_errors" else "")
        ]
    if isinstance(detail, list):
        return [line for item in detail for line in _flatten(item, prefix)]
    return [f"{prefix}{detail}"]


def _first_code(codes: Any) -> str:
    if isinstance(codes, dict):
        return next((_first_code(value) for value in codes.values()), "invalid")
    if isinstance(codes, list):
        return _first_code(codes[0]) if codes else "invalid"
    return str(codes)


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **extra}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, NotPermitted):
        return Response(error_body(exc.code, str(exc)), status=403)
    if isinstance(exc, OutboxError | InboxError | ConsoleError):
        status_code = 409 if exc.code in CONFLICT_CODES else 400
        return Response(error_body(exc.code, str(exc)), status=status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    if isinstance(exc, exceptions.ValidationError):
        body = error_body(
            "validation_error" if isinstance(exc.detail, dict) else _first_code(exc.get_codes()),
            " ".join(_flatten(exc.detail)),
            errors=exc.detail,
        )
    else:
        body = error_body(_first_code(exc.get_codes()), " ".join(_flatten(exc.detail)))
    response.data = body
    return response
