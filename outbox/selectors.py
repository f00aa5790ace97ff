"""Reads of the outbox for the console, the API and the metrics."""

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from django.db import connection
from django.db.models import Case, CharField, Exists, Min, OuterRef, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce
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
    delivered_at: datetime | None
    delivered_partition: int | None
    delivered_offset: int | None


def outbox_events_with_delivery(
    queryset: QuerySet[OutboxEvent],
) -> "QuerySet[WithAnnotations[OutboxEvent, DeliveryAnnotations]]":
    """The events of `queryset` with their delivery as users see it, whichever relay sent
    them: `delivery_status` (PENDING, DONE or FAILED) and `delivered_at`, `delivered_partition`,
    `delivered_offset`. The claim relay writes these on the event row; the event-log relay
    appends a delivery record and, for a key it holds, a held event whose attempts are spent
    once it is FAILED."""
    published = OutboxDelivery.objects.filter(
        event_id=OuterRef("pk"), outcome=OutboxDelivery.Outcome.PUBLISHED
    ).order_by("id")
    spent = OutboxHeldEvent.objects.filter(
        event_id=OuterRef("pk"), next_attempt_at__isnull=True, attempts__gt=0
    )
    status = OutboxEvent.Status
    return queryset.annotate(
        delivery_status=Case(
            When(status=status.DONE, then=Value(status.DONE)),
            When(Exists(published), then=Value(status.DONE)),
            When(status=status.FAILED, then=Value(status.FAILED)),
            When(Exists(spent), then=Value(status.FAILED)),
            default=Value(status.PENDING),
            output_field=CharField(),
        ),
        delivered_at=Coalesce("published_at", Subquery(published.values("published_at")[:1])),
        delivered_partition=Coalesce(
            "kafka_partition", Subquery(published.values("kafka_partition")[:1])
        ),
        delivered_offset=Coalesce("kafka_offset", Subquery(published.values("kafka_offset")[:1])),
    )
