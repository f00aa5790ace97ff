"""The relay's claim and marks: lease a batch of due events, then record each outcome. Marking
a batch takes one statement per outcome, never one per row."""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction

# Which rows a claim may take: due, PENDING, not leased to a live relay.
_CLAIMABLE = """
    event.status = 'PENDING'
    AND event.next_attempt_at <= now()
    AND (event.locked_until IS NULL OR event.locked_until < now())
"""

# A claim finds its events first, without locking anything, then leases them by id. The
# finding queries probe the table; a locking query that did the same would re-run them
# for every row another relay changed meanwhile (PostgreSQL re-checks a changed row against
# the whole query), and relays claiming side by side then spent minutes per claim. Leasing by
# id re-checks only the row itself.
#
# The first pass: among the oldest claimable events, those that are the next of their key.
# It looks at no more than %(window)s rows: past them, a backlog queued deep on a few keys
# whose next events are out with another relay would be probed row by row in vain. Neither
# pass joins the table to itself: a first pass that did ran for 149 s in a fault scenario
# (celery-redis), where a plain probe per row takes milliseconds.
CLAIM_OLDEST_SQL = f"""
SELECT oldest.id, oldest.position
FROM (
    SELECT event.id, event.topic, event.key, event.position
    FROM outbox_event AS event
    WHERE {_CLAIMABLE}
    ORDER BY event.position
    LIMIT %(window)s
) AS oldest
-- Order per key: only the oldest undelivered event of a (topic, key) may go out.
WHERE NOT EXISTS (
    SELECT 1 FROM outbox_event AS earlier
    WHERE earlier.topic = oldest.topic
      AND earlier.key = oldest.key
      AND earlier.position < oldest.position
      AND earlier.status <> 'DONE'
      AND earlier.discarded_at IS NULL
)
ORDER BY oldest.position
LIMIT %(batch_size)s
"""  # noqa: S608 (composed of the constants above, no input)

# The second pass, when the first did not fill the batch: the oldest undelivered event of
# every (topic, key), read in one ordered walk of outbox_event_undelivered_idx (about a
# microsecond a row), and of those the claimable ones. A key whose oldest undelivered event
# is FAILED, waiting for its retry or out with a relay is skipped whole.
CLAIM_HEADS_SQL = f"""
SELECT event.id, event.position
FROM (
    SELECT DISTINCT ON (topic, key) id, position, status, next_attempt_at, locked_until
    FROM outbox_event
    WHERE status <> 'DONE' AND discarded_at IS NULL
    ORDER BY topic, key, position
) AS event
WHERE {_CLAIMABLE}
ORDER BY event.position
LIMIT %(batch_size)s
"""  # noqa: S608 (composed of the constants above, no input)

# The lease: the found events that are still claimable once locked (another relay may have
# taken or published one since), skipping those another claim holds.
CLAIM_LEASE_SQL = f"""
WITH candidates AS (
    SELECT event.id
    FROM outbox_event AS event
    WHERE event.id = ANY(%(ids)s::uuid[]) AND {_CLAIMABLE}
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_event AS event
SET locked_until = now() + make_interval(secs => %(lease_seconds)s),
    locked_by = %(relay_id)s
FROM candidates
WHERE event.id = candidates.id
RETURNING event.id, event.aggregatetype, event.aggregateid, event.type, event.payload::text,
          event.headers, event.topic, event.key, event.created_at, event.attempts,
          event.position
"""  # noqa: S608 (composed of the constants above, no input)
# Rows the first pass examines, per row of the batch.
CLAIM_WINDOW_FACTOR = 2


@dataclass(frozen=True, slots=True)
class ClaimedEvent:
    id: uuid.UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    # The stored JSON as PostgreSQL prints it: sent as it is, never parsed on the hot path.
    payload_json: str
    headers: dict[str, str]
    topic: str
    key: str
    created_at: datetime
    attempts: int
    position: int


@dataclass(frozen=True, slots=True)
class Delivery:
    event_id: uuid.UUID
    partition: int
    offset: int
    published_at: datetime


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    event_id: uuid.UUID
    error: str


def outbox_events_claim(*, relay_id: str, batch_size: int) -> list[ClaimedEvent]:
    """Leases up to batch_size due events to relay_id, in a transaction of its own."""
    parameters = {"batch_size": batch_size, "window": batch_size * CLAIM_WINDOW_FACTOR}
    with transaction.atomic(), connection.cursor() as cursor:
        # A claim is a short query run many times a second: compiling it (JIT) costs more
        # than it saves, whatever the planner estimates for a large backlog.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(CLAIM_OLDEST_SQL, parameters)
        found = dict(cursor.fetchall())
        if len(found) < batch_size:
            # The walk of the index in key order is what makes this pass cheap; a planner
            # that expects many rows would rather scan the table and sort it.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute(CLAIM_HEADS_SQL, parameters)
            found.update(cursor.fetchall())
        if not found:
            return []
        oldest_first = sorted(found, key=found.__getitem__)[:batch_size]
        cursor.execute(
            CLAIM_LEASE_SQL,
            {
                "ids": oldest_first,
                "lease_seconds": settings.OUTBOX_LEASE_SECONDS,
                "relay_id": relay_id,
            },
        )
        rows = cursor.fetchall()
    events = [
        ClaimedEvent(
            id=row[0],
            aggregate_type=row[1],
            aggregate_id=row[2],
            event_type=row[3],
            payload_json=row[4],
            headers=json.loads(row[5]) if isinstance(row[5], str) else row[5],
            topic=row[6],
            key=row[7],
            created_at=row[8],
            attempts=row[9],
            position=row[10],
        )
        for row in rows
    ]
    # The UPDATE returns rows in no particular order; the producer must send them by position.
    events.sort(key=lambda event: event.position)
    return events


def outbox_events_mark_published(*, deliveries: Sequence[Delivery]) -> int:
    if not deliveries:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE outbox_event AS event
            SET status = 'DONE', attempts = event.attempts + 1, last_error = '',
                published_at = delivery.published_at, kafka_partition = delivery.partition,
                kafka_offset = delivery.kafka_offset, locked_until = NULL, locked_by = '',
                updated_at = now()
            FROM unnest(%s::uuid[], %s::integer[], %s::bigint[], %s::timestamptz[])
                 AS delivery(id, partition, kafka_offset, published_at)
            WHERE event.id = delivery.id AND event.status = 'PENDING'
            """,
            [
                [d.event_id for d in deliveries],
                [d.partition for d in deliveries],
                [d.offset for d in deliveries],
                [d.published_at for d in deliveries],
            ],
        )
        return cursor.rowcount


def outbox_events_mark_failed(*, relay_id: str, failures: Sequence[DeliveryFailure]) -> int:
    """Counts a failed attempt; schedules the next one by exponential backoff with jitter,
    or marks the event FAILED after OUTBOX_MAX_ATTEMPTS."""
    if not failures:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE outbox_event AS event
            SET attempts = event.attempts + 1,
                last_error = failure.error,
                status = CASE WHEN event.attempts + 1 >= %(max_attempts)s
                              THEN 'FAILED' ELSE 'PENDING' END,
                -- "Equal jitter": half the exponential delay, plus up to as much again at random.
                next_attempt_at = now() + make_interval(secs =>
                    LEAST(%(max_seconds)s, %(base_seconds)s * power(2, event.attempts))
                    * (0.5 + random() / 2)),
                locked_until = NULL, locked_by = '', updated_at = now()
            FROM unnest(%(ids)s::uuid[], %(errors)s::text[]) AS failure(id, error)
            WHERE event.id = failure.id AND event.status = 'PENDING'
              AND event.locked_by = %(relay_id)s
            """,
            {
                "max_attempts": settings.OUTBOX_MAX_ATTEMPTS,
                "max_seconds": settings.OUTBOX_RETRY_MAX_SECONDS,
                "base_seconds": settings.OUTBOX_RETRY_BASE_SECONDS,
                "ids": [f.event_id for f in failures],
                "errors": [f.error for f in failures],
                "relay_id": relay_id,
            },
        )
        return cursor.rowcount


def outbox_events_release(*, relay_id: str, event_ids: Sequence[uuid.UUID]) -> int:
    """Gives claimed events back untouched, for another attempt as soon as a relay is ready."""
    if not event_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE outbox_event SET locked_until = NULL, locked_by = '', updated_at = now()
            WHERE id = ANY(%s::uuid[]) AND status = 'PENDING' AND locked_by = %s
            """,
            [list(event_ids), relay_id],
        )
        return cursor.rowcount
