"""Bulk actions of the API: by ids or by the list's filters, with a dry run."""

from typing import Any

from django.db.models import QuerySet
from django.urls import reverse
from django_filters import FilterSet
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.exceptions import ConsoleAPIError
from console.bulk_operations import bulk_action_count, bulk_action_run


def bulk_queryset(
    *, data: dict[str, Any], filterset_class: type[FilterSet], queryset: QuerySet
) -> tuple[QuerySet, dict[str, Any]]:
    """The rows a bulk request names, and what the audit log keeps of how it named them."""
    if "ids" in data:
        ids = [str(value) for value in data["ids"]]
        return queryset.filter(pk__in=ids), {"ids": ids}
    filters = dict(data["filter"])
    unknown = sorted(set(filters) - set(filterset_class.base_filters))
    if unknown:
        raise ConsoleAPIError(
            "unknown_filter",
            f"Unknown filter {', '.join(unknown)}; the filters are "
            f"{', '.join(sorted(filterset_class.base_filters))}.",
        )
    if not filters:
        raise ConsoleAPIError(
            "empty_filter",
            "An empty filter would select every row; name at least one filter.",
        )
    filterset = filterset_class(data=filters, queryset=queryset)
    if not filterset.is_valid():
        raise ValidationError({"filter": filterset.errors})
    return filterset.qs, filters


def bulk_response(
    *,
    request: Request,
    action: str,
    data: dict[str, Any],
    filterset_class: type[FilterSet],
    queryset: QuerySet,
) -> Response:
    """200 with the result of a dry run or of a set of one chunk; 202 with the operation's URL
    (also in Location) for a larger set, queued."""
    rows, described = bulk_queryset(data=data, filterset_class=filterset_class, queryset=queryset)
    return bulk_rows_response(
        request=request,
        action=action,
        rows=rows,
        dry_run=bool(data.get("dry_run")),
        reason=data.get("reason", ""),
        filters=described if "ids" not in described else {},
    )


def bulk_rows_response(
    *,
    request: Request,
    action: str,
    rows: QuerySet,
    dry_run: bool,
    reason: str,
    filters: dict[str, Any],
) -> Response:
    """The answer of a bulk action over `rows` (see bulk_response); `filters` is what the audit
    log keeps of how the rows were named."""
    if dry_run:
        return Response(
            {
                "action": action,
                "dry_run": True,
                "matched": bulk_action_count(rows),
                "changed": None,
                "queued_chunks": 0,
                "audit_id": None,
                "operation_id": None,
                "operation_url": None,
                "status": None,
            }
        )
    record = bulk_action_run(
        user=request.user,
        action=action,
        source="api",
        reason=reason,
        queryset=rows,
        filters=filters,
    )
    operation = record.bulk_operation
    url = request.build_absolute_uri(reverse("bulk-operation-detail", args=[operation.pk]))
    queued = not operation.is_finished
    return Response(
        {
            "action": action,
            "dry_run": False,
            "matched": record.requested,
            # Known once every chunk ran; the operation (operation_url) shows the progress.
            "changed": None if queued else record.changed,
            "queued_chunks": record.chunks_pending,
            "audit_id": record.pk,
            "operation_id": operation.pk,
            "operation_url": url,
            "status": operation.status,
        },
        status=202 if queued else 200,
        headers={"Location": url} if queued else None,
    )
