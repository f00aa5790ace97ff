from typing import TYPE_CHECKING, Any

import django_filters
from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView

from console.api.exceptions import ConsoleAPIError

# Query parameters that are not filters.
RESERVED_PARAMETERS = frozenset({"cursor", "page_size", "format"})


class StrictFilterBackend(DjangoFilterBackend):
    """django-filter, plus a 400 for a query parameter that is no filter: a typo in a filter
    name must not silently return every row."""

    def filter_queryset(self, request: "Request", queryset: QuerySet, view: "APIView") -> Any:
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is not None and getattr(view, "action", None) == "list":
            known = set(filterset_class.base_filters) | RESERVED_PARAMETERS
            for name in filterset_class.base_filters.values():
                known.update(getattr(name, "extra_parameter_names", ()))
            unknown = sorted(set(request.query_params) - known)
            if unknown:
                raise ConsoleAPIError(
                    "unknown_filter",
                    f"Unknown filter {', '.join(unknown)}; the filters are "
                    f"{', '.join(sorted(filterset_class.base_filters))}.",
                )
        return super().filter_queryset(request, queryset, view)


class DeliveryFilter(django_filters.FilterSet):
    """The filters outbox events and inbox messages share. Exact matches only. The inbox has an
    index for each; the outbox's event table a B-tree for the key only (each costs WAL in every
    business transaction that publishes) and, for the others, a BRIN index of bloom filters
    that skips the ranges without the value (outbox.models.OutboxEvent.Meta). Subclasses add
    their id, status and time ranges."""

    event_type = django_filters.CharFilter(field_name="event_type")
    aggregate_type = django_filters.CharFilter(field_name="aggregate_type")
    aggregate_id = django_filters.CharFilter(field_name="aggregate_id")
    topic = django_filters.CharFilter(field_name="topic")
    key = django_filters.CharFilter(field_name="key")
    discarded = django_filters.BooleanFilter(
        field_name="discarded_at", lookup_expr="isnull", exclude=True
    )
