"""Filters of the outbox events, on their delivery as users see it (the annotations of
outbox.selectors.outbox_events_with_delivery). The admin's list filters use the same
selectors."""

import django_filters
from django.db.models import QuerySet

from console.api.fields import DateTimeFilter
from console.api.filters import DeliveryFilter
from outbox.models import OutboxEvent
from outbox.selectors import outbox_events_discarded, outbox_events_in_state

Status = OutboxEvent.Status


class OutboxEventFilter(DeliveryFilter):
    """Filters of /api/outbox/events/ and of its bulk actions. The queryset must carry the
    annotations of outbox_events_with_delivery."""

    id = django_filters.UUIDFilter(field_name="id")
    status = django_filters.ChoiceFilter(choices=Status.choices, method="filter_status")
    created_after = DateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = DateTimeFilter(field_name="created_at", lookup_expr="lt")
    # When the broker confirmed the event's latest publication.
    published_after = DateTimeFilter(field_name="delivered_at", lookup_expr="gte")
    published_before = DateTimeFilter(field_name="delivered_at", lookup_expr="lt")
    discarded = django_filters.BooleanFilter(method="filter_discarded")

    class Meta:
        model = OutboxEvent
        fields: list[str] = []

    # django-filter calls these with a value only; the type hints name the parameters'
    # types in the OpenAPI schema.
    def filter_status(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return outbox_events_in_state(queryset, state=value)

    def filter_discarded(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        return outbox_events_discarded(queryset, discarded=value)
