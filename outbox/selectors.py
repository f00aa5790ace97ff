"""Reads of the outbox for the console, the API and the metrics."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings
from django.db import connection
from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    F,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, NullIf
from django.utils import timezone

from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.services.event_log import ALL_SHARDS

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
    With the event-log relay, the held keys (outbox_log_held_keys)."""
    if settings.OUTBOX_RELAY_LOG:
        return outbox_log_held_keys(limit=limit)
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
    return [_quarantined_key(row) for row in rows]


def outbox_log_held_keys(*, limit: int = 100) -> list[QuarantinedKey]:
    """The keys the event-log relay holds, each with its head (the first of its held events in
    commit order): FAILED once its attempts are spent, else PENDING (backing off, or due), and
    how many held events wait behind it. Heads waiting for an operator come first, then by
    their next try. The held set is small (rows exist only for keys with a failure, a replay
    or a discard), so it is read whole."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT topic, key, event_id,
                   CASE WHEN next_attempt_at IS NULL AND attempts > 0 THEN 'FAILED'
                        ELSE 'PENDING' END,
                   attempts, last_error, next_attempt_at, waiting
            FROM (
                SELECT topic, key, event_id, attempts, next_attempt_at, last_error,
                       transaction_id, position,
                       row_number() OVER per_key AS rank,
                       count(*) OVER (PARTITION BY topic, key) - 1 AS waiting
                FROM outbox_held_event
                WINDOW per_key AS (PARTITION BY topic, key ORDER BY transaction_id, position)
            ) AS held
            WHERE rank = 1
            ORDER BY next_attempt_at NULLS FIRST, attempts DESC, transaction_id, position
            LIMIT %s
            """,
            [limit],
        )
        rows = cursor.fetchall()
    return [_quarantined_key(row) for row in rows]


def _quarantined_key(row: Sequence[Any]) -> QuarantinedKey:
    return QuarantinedKey(
        topic=row[0],
        key=row[1],
        blocking_event_id=str(row[2]),
        blocking_status=row[3],
        blocking_attempts=row[4],
        blocking_error=row[5],
        blocking_next_attempt_at=row[6],
        waiting_events=row[7],
    )


def outbox_oldest_pending_age_seconds() -> float | None:
    """Seconds since the oldest event still to be sent was created, or None when there is
    none. With the event-log relay: the oldest of the unsent and the held, not spent, events
    (outbox_log_backlog)."""
    if settings.OUTBOX_RELAY_LOG:
        oldest = outbox_log_backlog().oldest_pending_created_at
    else:
        oldest = OutboxEvent.objects.filter(status=OutboxEvent.Status.PENDING).aggregate(
            oldest=Min("created_at")
        )["oldest"]
    return None if oldest is None else (timezone.now() - oldest).total_seconds()


def outbox_last_published_at() -> datetime | None:
    """When the broker last confirmed an event: the latest published_at of the event rows
    (the claim relay), or of the latest PUBLISHED delivery record (the event-log relay),
    found by walking the records' primary key backwards from the newest."""
    if not settings.OUTBOX_RELAY_LOG:
        last: datetime | None = OutboxEvent.objects.aggregate(last=Max("published_at"))["last"]
        return last
    return (
        OutboxDelivery.objects.filter(outcome=OutboxDelivery.Outcome.PUBLISHED)
        .order_by("-id")
        .values_list("published_at", flat=True)
        .first()
    )


# --- the event-log relay's backlog ----------------------------------------------------------
# That relay never updates an event row, so no index on the rows says what is left to send.
# Its cursors do: every event visible in the snapshot of the oldest current cursor's tick is
# delivered, held or discarded, so what is left is found from that snapshot's xmin on the
# (txid, position) index (the events after the cursors, few while the relay keeps up), less
# those with an outcome, plus the held set (small). The backlog scans neither the event nor
# the delivery table.

# A snapshot in which no transaction is visible: with no cursor recorded, every event is left.
NOTHING_VISIBLE_SNAPSHOT = "1:1:"


@dataclass(frozen=True)
class LogBacklog:
    # Events after the cursors with no PUBLISHED or DISCARDED record, not held.
    unsent: int
    # Held events still to be sent: a head backing off or due, or one queued behind a head.
    held_waiting: int
    # Held heads whose attempts are spent: FAILED, waiting for an operator.
    held_spent: int
    # The oldest created_at of the unsent and the held-waiting events.
    oldest_pending_created_at: datetime | None


def outbox_log_cursor_snapshot() -> str:
    """The snapshot of the tick of the oldest current cursor (the latest cursor row of each
    shard, as outbox.services.event_log.cursors_read reads them), read in one statement: a
    purge of ticks between two reads could not take it away."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT tick.snapshot::text FROM outbox_tick AS tick
            WHERE tick.id = (
                SELECT min(latest.tick_id)
                FROM unnest(%s::smallint[]) AS shard
                CROSS JOIN LATERAL (
                    SELECT tick_id FROM outbox_relay_cursor
                    WHERE shard = ANY(shards) ORDER BY id DESC LIMIT 1
                ) AS latest
            )
            """,
            [list(ALL_SHARDS)],
        )
        row = cursor.fetchone()
    return row[0] if row else NOTHING_VISIBLE_SNAPSHOT


# The events after the cursors with no outcome yet, not held: a range of the (txid, position)
# index from the xmin of the oldest cursor's snapshot, each checked for an outcome through the
# event_id indexes. The snapshot goes in as a constant, so that the planner reads the size of
# that range from the statistics (and the end of the index).
_UNSENT_SQL = """
SELECT count(*) AS events, min(event.created_at) AS oldest
FROM outbox_event AS event
WHERE event.txid >= pg_snapshot_xmin(%(since)s::pg_snapshot)
  AND NOT pg_visible_in_snapshot(event.txid, %(since)s::pg_snapshot)
  AND NOT EXISTS (
      SELECT 1 FROM outbox_delivery AS delivery
      WHERE delivery.event_id = event.id AND delivery.outcome IN ('PUBLISHED', 'DISCARDED')
  )
  AND NOT EXISTS (SELECT 1 FROM outbox_held_event AS held WHERE held.event_id = event.id)
"""


def outbox_log_backlog() -> LogBacklog:
    """What the event-log relay has still to send (PENDING) or has given up on until an
    operator acts (FAILED), and the creation time of the oldest event still to be sent. Held
    events whose row is gone (the relay lets them go) are not counted."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH unsent AS ({_UNSENT_SQL}),
            held AS (
                SELECT count(*) FILTER (WHERE held.spent) AS spent,
                       count(*) FILTER (WHERE NOT held.spent) AS waiting,
                       min(event.created_at) FILTER (WHERE NOT held.spent) AS oldest
                FROM (
                    SELECT event_id, next_attempt_at IS NULL AND attempts > 0 AS spent
                    FROM outbox_held_event
                ) AS held
                JOIN outbox_event AS event ON event.id = held.event_id
            )
            SELECT unsent.events, held.waiting, held.spent, least(unsent.oldest, held.oldest)
            FROM unsent, held
            """,  # noqa: S608 (composed of constants; values are parameters)
            {"since": outbox_log_cursor_snapshot()},
        )
        unsent, waiting, spent, oldest = cursor.fetchone()
    return LogBacklog(
        unsent=unsent, held_waiting=waiting, held_spent=spent, oldest_pending_created_at=oldest
    )


def outbox_log_done_count() -> int:
    """The events delivered, counted exactly: every event less those left to send (unsent or
    held) and those given up on (the latest of their PUBLISHED and DISCARDED records is a
    DISCARDED one, or the claim relay discarded the row and no record came after). One
    statement, so the parts are counted at the same instant.

    This is outbox_events_with_delivery's DONE as long as every event the cursors have passed
    was delivered, held or discarded, which the relay keeps true (and the take-over, for what
    the claim relay left). Counting that DONE event by event would join the two tables whole:
    six times the cost of this on 200,000 events. This still counts every event row and reads
    the delivery table for its DISCARDED records: for small tables only (the console estimates
    DONE on big ones)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH unsent AS ({_UNSENT_SQL}),
            discarded AS (
                SELECT final.event_id FROM (
                    SELECT DISTINCT ON (event_id) event_id, outcome FROM outbox_delivery
                    WHERE outcome IN ('PUBLISHED', 'DISCARDED')
                      AND event_id IN (
                          SELECT event_id FROM outbox_delivery WHERE outcome = 'DISCARDED'
                      )
                    ORDER BY event_id, id DESC
                ) AS final
                WHERE final.outcome = 'DISCARDED'
                UNION
                SELECT event.id FROM outbox_event AS event
                WHERE event.discarded_at IS NOT NULL
                  AND NOT EXISTS (
                      SELECT 1 FROM outbox_delivery AS delivery
                      WHERE delivery.event_id = event.id
                        AND delivery.outcome IN ('PUBLISHED', 'DISCARDED')
                  )
            )
            SELECT (SELECT count(*) FROM outbox_event)
                   - (SELECT events FROM unsent)
                   - (SELECT count(*) FROM outbox_held_event AS held
                      WHERE EXISTS (SELECT 1 FROM outbox_event AS event
                                    WHERE event.id = held.event_id))
                   - (SELECT count(*) FROM discarded
                      WHERE EXISTS (SELECT 1 FROM outbox_event AS event
                                    WHERE event.id = discarded.event_id)
                        AND NOT EXISTS (SELECT 1 FROM outbox_held_event AS held
                                        WHERE held.event_id = discarded.event_id))
            """,  # noqa: S608 (composed of constants; values are parameters)
            {"since": outbox_log_cursor_snapshot()},
        )
        return int(cursor.fetchone()[0])


class DeliveryAnnotations(TypedDict):
    delivery_status: str
    delivery_discarded_at: datetime | None
    delivery_attempts: int
    delivery_error: str
    delivery_next_attempt_at: datetime | None
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
    one's), `delivery_next_attempt_at` (when it is tried next; none once its attempts are
    spent or it is delivered), and where the latest publication went: `delivered_at`,
    `delivered_partition`, `delivered_offset`.

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
        delivery_next_attempt_at=Case(
            When(held=True, then=Subquery(held.values("next_attempt_at")[:1])),
            When(final_outcome__isnull=False, then=None),
            When(status=status.PENDING, then=F("next_attempt_at")),
            default=None,
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
    status = OutboxEvent.Status
    held = OutboxHeldEvent.objects.order_by().values("event_id")
    discarded = (
        OutboxDelivery.objects.filter(outcome=OutboxDelivery.Outcome.DISCARDED)
        .order_by()
        .values("event_id")
    )
    if state == DISCARDED:
        return events.filter(
            Q(discarded_at__isnull=False) | Q(pk__in=discarded),
            delivery_discarded_at__isnull=False,
        )
    if state == status.FAILED:
        failed_rows = OutboxEvent.objects.filter(status=status.FAILED).order_by().values("pk")
        spent = held.filter(next_attempt_at__isnull=True, attempts__gt=0)
        candidates = failed_rows.union(spent, discarded, all=True)
        return events.filter(pk__in=candidates, delivery_status=state)
    if state == status.PENDING:
        return events.filter(Q(status=status.PENDING) | Q(pk__in=held), delivery_status=state)
    return events.filter(delivery_status=state)


def outbox_events_discarded(events: QuerySet, *, discarded: bool) -> QuerySet:
    """The events of `events` (annotated) an operator discarded, or the others."""
    if discarded:
        return outbox_events_in_state(events, state=DISCARDED)
    return events.filter(delivery_discarded_at__isnull=True)
