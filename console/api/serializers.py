"""Input and output of the actions every API offers: a note, a bulk selection (ids or the
list's filters, with a dry run) and the bulk result."""

from typing import Any

import django_filters
from django.conf import settings
from django_filters import FilterSet
from drf_spectacular.utils import (
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema_field,
)
from rest_framework import serializers

from console.privacy import ROOTS, masked, may_view_payload


class ActionInputSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


def bulk_reason_field() -> serializers.CharField:
    """A bulk action's reason, checked where the action runs (bulk_reason_cleaned)."""
    return serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=2000,
        default="",
        help_text="Why the rows are changed, kept in the audit log: required (not blank) "
        "unless dry_run; a request without one gets 400 with code reason_required.",
    )


class BulkInputSerializer(serializers.Serializer):
    """A bulk action's selection and its reason. Subclasses declare `ids` with their model's
    id field."""

    ids: serializers.ListField
    filter = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        help_text='The list endpoint\'s filters, e.g. {"status": "FAILED"}.',
    )
    dry_run = serializers.BooleanField(default=False)
    reason = bulk_reason_field()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError("Give either 'ids' or 'filter', not both or none.")
        if len(attrs.get("ids", ())) > settings.API_BULK_MAX_IDS:
            raise serializers.ValidationError(
                f"At most {settings.API_BULK_MAX_IDS} ids per request; select by filter instead."
            )
        return attrs


class BulkResultSerializer(serializers.Serializer):
    """200: a dry run, or a set of one chunk, done. 202: a larger set, queued as a bulk
    operation; `operation_url` serves its progress and its cancel."""

    action = serializers.CharField(read_only=True)
    dry_run = serializers.BooleanField(read_only=True)
    matched = serializers.IntegerField(read_only=True)
    changed = serializers.IntegerField(read_only=True, allow_null=True)
    queued_chunks = serializers.IntegerField(read_only=True)
    audit_id = serializers.IntegerField(read_only=True, allow_null=True)
    operation_id = serializers.IntegerField(read_only=True, allow_null=True)
    operation_url = serializers.CharField(read_only=True, allow_null=True)
    status = serializers.CharField(read_only=True, allow_null=True)


def bulk_results_schema() -> dict[int, Any]:
    """The answers of a bulk action as the OpenAPI schema states them."""
    return {
        200: OpenApiResponse(
            BulkResultSerializer, description="A dry run, or a set of one chunk, done."
        ),
        202: OpenApiResponse(
            BulkResultSerializer,
            description="A larger set, queued as a bulk operation: `operation_url` (also the "
            "Location header) serves its progress, and its cancel.",
        ),
    }


class BulkOperationSerializer(serializers.Serializer):
    """A bulk operation and its progress."""

    id = serializers.IntegerField(read_only=True)
    status = serializers.ChoiceField(
        choices=["QUEUED", "RUNNING", "DONE", "CANCELLED", "FAILED"], read_only=True
    )
    action = serializers.CharField(source="audit.action", read_only=True)
    model = serializers.CharField(source="audit.model", read_only=True)
    reason = serializers.CharField(source="audit.reason", read_only=True)
    requested_by = serializers.CharField(source="audit.username", read_only=True)
    filters = serializers.JSONField(source="audit.filters", read_only=True)
    rows_requested = serializers.IntegerField(source="audit.requested", read_only=True)
    rows_done = serializers.IntegerField(read_only=True)
    rows_changed = serializers.IntegerField(read_only=True)
    chunks_total = serializers.IntegerField(read_only=True)
    chunks_done = serializers.IntegerField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    started_at = serializers.DateTimeField(read_only=True, allow_null=True)
    finished_at = serializers.DateTimeField(read_only=True, allow_null=True)
    cancel_requested_at = serializers.DateTimeField(read_only=True, allow_null=True)
    cancelled_by = serializers.CharField(read_only=True)
    error = serializers.CharField(read_only=True)
    resumes = serializers.IntegerField(
        read_only=True,
        help_text="Times its worker died and it was queued again, to resume at its first "
        "chunk not applied.",
    )
    audit_id = serializers.IntegerField(read_only=True)


def _filter_value_schema(filter_: django_filters.Filter) -> dict[str, Any]:
    if isinstance(filter_, django_filters.ChoiceFilter):
        return {"type": "string", "enum": [str(value) for value, _ in filter_.extra["choices"]]}
    return {"type": "string"}


class _IdsRequired(serializers.Serializer):
    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["ids"].required = True
        return fields


def bulk_request_schema(
    *, name: str, serializer_class: type[BulkInputSerializer], filterset_class: type[FilterSet]
) -> PolymorphicProxySerializer:
    """The request body of a bulk action as the OpenAPI schema states it: one of two shapes,
    the rows named by `ids`, or by `filter`, an object of the list's filters (at least one,
    no other), with the other fields of `serializer_class` in both. A body with both, or
    neither, matches no shape (oneOf), as serializer_class.validate refuses it."""
    filters = filterset_class.base_filters
    filter_schema = {
        "type": "object",
        "description": "The list endpoint's filters, at least one; values as in its query.",
        "properties": {key: _filter_value_schema(filter_) for key, filter_ in filters.items()},
        "additionalProperties": False,
        "minProperties": 1,
    }
    by_filter_field = extend_schema_field(filter_schema)(
        type(f"{name}Filter", (serializers.DictField,), {})
    )
    by_ids = type(
        f"{name}ByIdsSerializer",
        (_IdsRequired, serializer_class),
        {
            "__doc__": "The rows named by their ids.",
            "__module__": __name__,
            "filter": None,
        },
    )
    by_filter = type(
        f"{name}ByFilterSerializer",
        (serializer_class,),
        {
            "__doc__": "The rows the list's filters select.",
            "__module__": __name__,
            "ids": None,
            "filter": by_filter_field(child=serializers.CharField(allow_blank=True)),
        },
    )
    return PolymorphicProxySerializer(
        component_name=name,
        serializers=[by_ids, by_filter],
        resource_type_field_name=None,
    )


class PayloadPrivacyMixin(serializers.Serializer):
    """An event's or a message's content as console/privacy.py lets the requesting user see
    it: null without console.view_payload, masked fields replaced with it."""

    CONTENT_FIELDS = ("payload", "headers", "raw_value", "raw_value_encoding")

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        request = self.context.get("request")
        if not may_view_payload(getattr(request, "user", None)):
            for field in self.CONTENT_FIELDS:
                if field in data:
                    data[field] = None
            return data
        for root in ROOTS:
            if root in data:
                data[root] = masked(data[root], root)
        return data
