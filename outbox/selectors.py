"""Reads of the outbox for the console, the API and the metrics."""

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from django.db import connection
from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    F,
    Min,
    OuterRef,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, NullIf
from django.utils import timezone

from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


@dataclass(frozen=True)
class QuarantinedKey:
    topic: str
    key: str
    blocking_event_id: str
    blocking_status: str
    blocking_attempts: int
    blocking_error: str
    blocking_next_attempt_at: datetime | None
    waiting_events: int


def outbox_quarantined_keys(*, limit: int = 100) -> list[QuarantinedKey]:
    """Keys whose oldest undelivered event is FAILED or waiting for a retry, with that event.

    The key's later events wait behind it (order per key) until it is published or released.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT topic, key, id, status, attempts,
                   -- Read for the rows shown only: error texts are long, and carried
                   -- through the sort of every undelivered row they made it spill to disk.
                   (SELECT last_error FROM outbox_event AS blocking
                    WHERE blocking.id = undelivered.id),
                   next_attempt_at, waiting
            FROM (
                -- One pass over the undelivered rows, in the order of their index.
                SELECT topic, key, id, status, attempts, next_attempt_at,
                       row_number() OVER per_key AS rank,
                       count(*) OVER (PARTITION BY topic, key) - 1 AS waiting
                FROM outbox_event
                WHERE status <> 'DONE' AND discarded_at IS NULL
                WINDOW per_key AS (PARTITION BY topic, key ORDER BY position)
            ) AS undelivered
            WHERE rank = 1 AND (status = 'FAILED' OR attempts > 0)
            ORDER BY next_attempt_at NULLS FIRST
            LIMIT %s
            """,
            [limit],
        )
        rows = cursor.fetchall()
    return [
        QuarantinedKey(
            topic=row[0],
            key=row[1],
            blocking_event_id=str(row[2]),
            blocking_status=row[3],
            blocking_attempts=row[4],
            blocking_error=row[5],
            blocking_next_attempt_at=row[6],
            waiting_events=row[7],
        )
        for row in rows
    ]


def outbox_oldest_pending_age_seconds() -> float | None:
    oldest = OutboxEvent.objects.filter(status=OutboxEvent.Status.PENDING).aggregate(
        oldest=Min("created_at")
    )["oldest"]
    return None if oldest is None else (timezone.now() - oldest).total_seconds()


class DeliveryAnnotations(TypedDict):
    delivery_status: str
    delivery_discarded_at: datetime | None
    delivery_attempts: int
    delivery_error: str
    delivered_at: datetime | None
    delivered_partition: int | None
    delivered_offset: int | None


if TYPE_CHECKING:
    DeliveredEvent = WithAnnotations[OutboxEvent, DeliveryAnnotations]


def outbox_events_with_delivery(
    queryset: QuerySet[OutboxEvent],
) -> "QuerySet[DeliveredEvent]":
    """The events of `queryset` with their delivery as users see it, whichever relay sent
    them: `delivery_status` (PENDING, DONE or FAILED), `delivery_discarded_at`,
    `delivery_attempts` (tries that ended in a delivery report), `delivery_error` (the last
    one's), and where the latest publication went: `delivered_at`, `delivered_partition`,
    `delivered_offset`.

    The claim relay writes its outcome on the event row. The event-log relay never touches
    the row: a held event is PENDING, or FAILED once its attempts are spent; otherwise the
    latest PUBLISHED or DISCARDED delivery record decides (a replay holds the event again, and
    its new record supersedes the earlier one)."""
    outcome = OutboxDelivery.Outcome
    status = OutboxEvent.Status
    records = OutboxDelivery.objects.filter(event_id=OuterRef("pk"))
    published = records.filter(outcome=outcome.PUBLISHED).order_by("-id")
    final = records.filter(outcome__in=(outcome.PUBLISHED, outcome.DISCARDED)).order_by("-id")
    held = OutboxHeldEvent.objects.filter(event_id=OuterRef("pk"))
    tries = (
        records.filter(outcome__in=(outcome.PUBLISHED, outcome.FAILED))
        .order_by()
        .values("event_id")
        .annotate(count=Count("id"))
        .values("count")
    )
    return queryset.alias(
        held=Exists(held),
        held_spent=Exists(held.filter(next_attempt_at__isnull=True, attempts__gt=0)),
        final_outcome=Subquery(final.values("outcome")[:1]),
    ).annotate(
        delivery_status=Case(
            When(held_spent=True, then=Value(status.FAILED)),
            When(held=True, then=Value(status.PENDING)),
            When(final_outcome=outcome.PUBLISHED, then=Value(status.DONE)),
            When(final_outcome=outcome.DISCARDED, then=Value(status.FAILED)),
            default=F("status"),
            output_field=CharField(),
        ),
        delivery_discarded_at=Case(
            When(held=True, then=None),
            When(final_outcome=outcome.DISCARDED, then=Subquery(final.values("published_at")[:1])),
            default=F("discarded_at"),
        ),
        delivery_attempts=Greatest(F("attempts"), Coalesce(Subquery(tries), 0)),
        delivery_error=Coalesce(
            NullIf(Subquery(held.values("last_error")[:1]), Value("")),
            Subquery(records.filter(outcome=outcome.FAILED).order_by("-id").values("error")[:1]),
            F("last_error"),
            output_field=TextField(),
        ),
        delivered_at=Coalesce(Subquery(published.values("published_at")[:1]), "published_at"),
        delivered_partition=Coalesce(
            Subquery(published.values("kafka_partition")[:1]), "kafka_partition"
        ),
        delivered_offset=Coalesce(Subquery(published.values("kafka_offset")[:1]), "kafka_offset"),
    )


def outbox_event_delivered(*, event_id: uuid.UUID | str) -> "DeliveredEvent":
    """One event with its delivery as users see it (outbox_events_with_delivery)."""
    return outbox_events_with_delivery(OutboxEvent.objects.filter(pk=event_id)).get()
