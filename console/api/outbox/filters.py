"""Filters of the outbox events, on their delivery as users see it (the annotations of
outbox.selectors.outbox_events_with_delivery). The admin's list filters use the same
selectors."""

from datetime import datetime

import django_filters
from django.db.models import QuerySet

from console.api.fields import DateTimeFilter
from console.api.filters import DeliveryFilter
from outbox.models import OutboxEvent
from outbox.selectors import (
    outbox_events_discarded,
    outbox_events_in_state,
    outbox_events_published,
)

Status = OutboxEvent.Status


class OutboxEventFilter(DeliveryFilter):
    """Filters of /api/outbox/events/ and of its bulk actions. The queryset must carry the
    annotations of outbox_events_with_delivery."""

    id = django_filters.UUIDFilter(field_name="id")
    status = django_filters.ChoiceFilter(choices=Status.choices, method="filter_status")
    created_after = DateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = DateTimeFilter(field_name="created_at", lookup_expr="lt")
    # When the broker confirmed the event's latest publication (outbox_events_published).
    published_after = DateTimeFilter(method="filter_published", lookup_expr="gte")
    published_before = DateTimeFilter(method="filter_published", lookup_expr="lt")
    discarded = django_filters.BooleanFilter(method="filter_discarded")

    class Meta:
        model = OutboxEvent
        fields: list[str] = []

    _published_window_applied = False

    # django-filter calls these with a value only; the type hints name the parameters'
    # types in the OpenAPI schema.
    def filter_status(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return outbox_events_in_state(queryset, state=value)

    def filter_published(self, queryset: QuerySet, name: str, value: datetime) -> QuerySet:
        # Both ends of the window in one read of the delivery records, when the first of
        # them is applied.
        if self._published_window_applied:
            return queryset
        self._published_window_applied = True
        bounds = {}
        for parameter in ("published_after", "published_before"):
            moment = self.form.cleaned_data.get(parameter)
            if moment is not None:
                bounds[self.filters[parameter].lookup_expr] = moment
        return outbox_events_published(queryset, **bounds)

    def filter_discarded(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        return outbox_events_discarded(queryset, discarded=value)
