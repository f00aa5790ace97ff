"""Filters of the outbox events, on their delivery as users see it (the annotations of
outbox.selectors.outbox_events_with_delivery), whichever relay sent them. The admin's list
filters use the same functions."""

import django_filters
from django.db.models import Q, QuerySet

from console.api.filters import DeliveryFilter
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent

Status = OutboxEvent.Status
Outcome = OutboxDelivery.Outcome
# The admin's status filter offers this besides the statuses: events an operator discarded.
DISCARDED = "discarded"


def outbox_events_in_state(events: QuerySet, *, state: str) -> QuerySet:
    """The events of `events` (annotated by outbox_events_with_delivery) whose delivery_status
    is `state` (PENDING, DONE or FAILED; FAILED includes the discarded ones, as the event row's
    status does), or with state "discarded", the ones an operator discarded.

    The annotations are computed per row: filtered on them alone, a rare state would have
    PostgreSQL compute them for every row of the table. So each state is narrowed first by a
    condition it implies (the annotations decide among what is left):
    - FAILED, rare and what operators look for, by the ids of the few events that can be
      FAILED: the row's FAILED status (an index serves it), the held heads whose attempts are
      spent, and the events with a DISCARDED record;
    - discarded and PENDING by a cheap test per row (the row's column, or membership in the
      held set or the DISCARDED records, each read once into a hash), as the list walks the
      events newest first;
    - DONE, the common state, fills a page at once and is not narrowed."""
    held = OutboxHeldEvent.objects.order_by().values("event_id")
    discarded = (
        OutboxDelivery.objects.filter(outcome=Outcome.DISCARDED).order_by().values("event_id")
    )
    if state == DISCARDED:
        return events.filter(
            Q(discarded_at__isnull=False) | Q(pk__in=discarded),
            delivery_discarded_at__isnull=False,
        )
    if state == Status.FAILED:
        failed_rows = OutboxEvent.objects.filter(status=Status.FAILED).order_by().values("pk")
        spent = held.filter(next_attempt_at__isnull=True, attempts__gt=0)
        candidates = failed_rows.union(spent, discarded, all=True)
        return events.filter(pk__in=candidates, delivery_status=state)
    if state == Status.PENDING:
        return events.filter(Q(status=Status.PENDING) | Q(pk__in=held), delivery_status=state)
    return events.filter(delivery_status=state)


def outbox_events_discarded(events: QuerySet, *, discarded: bool) -> QuerySet:
    """The events of `events` (annotated) an operator discarded, or the others."""
    if discarded:
        return outbox_events_in_state(events, state=DISCARDED)
    return events.filter(delivery_discarded_at__isnull=True)


class OutboxEventFilter(DeliveryFilter):
    """Filters of /api/outbox/events/ and of its bulk actions. The queryset must carry the
    annotations of outbox_events_with_delivery."""

    id = django_filters.UUIDFilter(field_name="id")
    status = django_filters.ChoiceFilter(choices=Status.choices, method="filter_status")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    # When the broker confirmed the event's latest publication, with either relay.
    published_after = django_filters.IsoDateTimeFilter(field_name="delivered_at", lookup_expr="gte")
    published_before = django_filters.IsoDateTimeFilter(field_name="delivered_at", lookup_expr="lt")
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
