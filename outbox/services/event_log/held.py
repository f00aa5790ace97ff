"""The held set: the events of keys held back by a failure, retried in order, and the
operators' repairs of them."""

import uuid
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction

from outbox.models import POSITION_SEQUENCE
from outbox.services.event_log.deliveries import DeliveryRecord, deliveries_insert
from outbox.services.event_log.shards import SHARD_SQL
from outbox.services.event_log.spans import (
    HEADER_TEXT_COLUMNS,
    LogEvent,
    event_rows_fetch,
    log_event_from_row,
)


def held_insert(
    held: Sequence[tuple[LogEvent, DeliveryRecord | None]], *, retry_seconds: float
) -> None:
    """A failed head is tried again after about retry_seconds; the events behind it wait."""
    with connection.cursor() as db:
        db.execute(
            """
            INSERT INTO outbox_held_event (event_id, shard, topic, key, transaction_id,
                                           position, event_transaction_id, event_position,
                                           event_created_at, attempts, next_attempt_at,
                                           last_error, held_at)
            SELECT held.event_id, held.shard, held.topic, held.key, held.txid, held.position,
                   held.txid, held.position, held.created_at, held.attempts,
                   CASE WHEN held.attempts > 0
                        THEN now() + make_interval(secs => %s * (0.5 + random() / 2)) END,
                   held.error, now()
            FROM unnest(%s::uuid[], %s::smallint[], %s::varchar[], %s::varchar[], %s::bigint[],
                        %s::bigint[], %s::timestamptz[], %s::integer[], %s::text[])
                 AS held(event_id, shard, topic, key, txid, position, created_at, attempts,
                         error)
            ON CONFLICT (event_id) DO NOTHING
            """,
            [
                retry_seconds,
                [event.id for event, _ in held],
                [event.shard for event, _ in held],
                [event.topic for event, _ in held],
                [event.key for event, _ in held],
                [event.txid for event, _ in held],
                [event.position for event, _ in held],
                [event.created_at for event, _ in held],
                [1 if failure else 0 for _, failure in held],
                [failure.error if failure else "" for _, failure in held],
            ],
        )


def held_keys_read(*, shards: Sequence[int], limit: int) -> set[tuple[str, str]] | None:
    """The held keys of `shards`, or None when there are more than `limit`: then a relay asks
    for the keys of each batch instead (held_keys_among), and a step costs the same whether a
    hundred keys are held or a million. Read in the order of the held set's index, which stops
    at the limit instead of gathering every held row first."""
    with connection.cursor() as db:
        db.execute(
            """
            SELECT DISTINCT shard, topic, key FROM outbox_held_event WHERE shard = ANY(%s)
            ORDER BY shard, topic, key LIMIT %s
            """,
            [list(shards), limit + 1],
        )
        rows = db.fetchall()
    return None if len(rows) > limit else {(topic, key) for _, topic, key in rows}


def held_keys_among(events: Sequence[LogEvent]) -> set[tuple[str, str]]:
    """Which of the keys of `events` are held: a look-up in the held set's index per key."""
    keys = {(event.shard, event.topic, event.key) for event in events}
    with connection.cursor() as db:
        db.execute(
            """
            SELECT DISTINCT held.topic, held.key
            FROM unnest(%s::smallint[], %s::varchar[], %s::varchar[]) AS batch(shard, topic, key)
            JOIN outbox_held_event AS held
              ON held.shard = batch.shard AND held.topic = batch.topic AND held.key = batch.key
            """,
            [[key[0] for key in keys], [key[1] for key in keys], [key[2] for key in keys]],
        )
        return {(topic, key) for topic, key in db.fetchall()}


def held_heads_due(
    *, shards: Sequence[int], done_tick_id: int, limit: int
) -> list[tuple[str, str]]:
    """The held keys whose head's retry has come due, oldest first.

    A head that never failed (queued behind one that has gone, or replayed by an operator)
    goes once the relay has read every event committed before it, those visible at tick
    `done_tick_id`: an event of its key committed earlier, not yet read, is held in front of
    it when read."""
    with connection.cursor() as db:
        db.execute(
            """
            SELECT head.topic, head.key FROM (
                SELECT DISTINCT ON (topic, key) topic, key, next_attempt_at, attempts,
                       transaction_id
                FROM outbox_held_event WHERE shard = ANY(%(shards)s)
                ORDER BY topic, key, position
            ) AS head, outbox_tick AS done
            WHERE done.id = %(done_tick_id)s
              AND (head.next_attempt_at <= now()
                   -- One whose attempts are spent waits for an operator.
                   OR (head.next_attempt_at IS NULL AND head.attempts = 0))
              AND (head.attempts > 0
                   OR head.transaction_id < pg_snapshot_xmin(done.snapshot)::text::bigint
                   OR pg_visible_in_snapshot(head.transaction_id::text::xid8, done.snapshot))
            ORDER BY head.next_attempt_at NULLS FIRST
            LIMIT %(limit)s
            """,
            {"shards": list(shards), "done_tick_id": done_tick_id, "limit": limit},
        )
        return [(topic, key) for topic, key in db.fetchall()]


# A held event's row, found through the relay's index of commit order (outbox_event_txid_idx)
# in the partition of its creation day alone: the event table has no B-tree on the id. A join
# PostgreSQL runs as a nested loop (a LATERAL read) probes one partition per held row.
HELD_EVENT_ROW_JOIN = (
    "event.txid = held.event_transaction_id::text::xid8 AND event.position = held.event_position"
    " AND event.created_at = held.event_created_at"
)


def held_events_read(*, topic: str, key: str, limit: int) -> list[LogEvent]:
    """The held events of one key, in order."""
    rows = event_rows_fetch(
        f"""
        SELECT event.id, event.aggregatetype, event.aggregateid, event.type,
               event.payload::text, event.headers::text, event.topic, event.key,
               event.created_at, held.transaction_id, held.position, held.shard,
               {HEADER_TEXT_COLUMNS}
        FROM outbox_held_event AS held
        JOIN outbox_event AS event ON {HELD_EVENT_ROW_JOIN}
        WHERE held.topic = %s AND held.key = %s
        ORDER BY held.position
        LIMIT %s
        """,  # noqa: S608 (constants; values are parameters)
        [topic, key, limit],
    )
    return list(map(log_event_from_row, rows))


def held_orphans_drop(*, topic: str, key: str) -> None:
    """Lets go of the held events of a key whose event rows no longer exist."""
    with connection.cursor() as db:
        db.execute(
            f"""
            DELETE FROM outbox_held_event AS held
            WHERE held.topic = %s AND held.key = %s
              AND NOT EXISTS (SELECT 1 FROM outbox_event AS event WHERE {HELD_EVENT_ROW_JOIN})
            """,  # noqa: S608 (constants; values are parameters)
            [topic, key],
        )


def held_release(*, relay_id: str, records: Sequence[DeliveryRecord]) -> None:
    """Records the deliveries of held events and lets them go."""
    with transaction.atomic():
        deliveries_insert(relay_id=relay_id, records=records)
        with connection.cursor() as db:
            db.execute(
                "DELETE FROM outbox_held_event WHERE event_id = ANY(%s::uuid[])",
                [[r.event_id for r in records]],
            )


def held_head_failed(
    *,
    relay_id: str,
    record: DeliveryRecord,
    refused: bool,
    max_attempts: int,
    base_seconds: float,
    max_seconds: float,
) -> bool:
    """Counts a failed retry of a held head: the next by exponential backoff with jitter, or
    none after `max_attempts` (an operator retries or discards it). Returns whether its
    attempts are now spent.

    Only a refusal (`refused`: by the producer, or a cluster's answer no retry changes) spends
    the last attempt. A try that nothing answered (timed out: the cluster or the partition's
    leader unreachable) counts and backs off, up to one attempt short of the last: an outage,
    however long, leaves no key waiting for an operator."""
    with transaction.atomic():
        deliveries_insert(relay_id=relay_id, records=[record])
        with connection.cursor() as db:
            db.execute(
                """
                UPDATE outbox_held_event
                SET attempts = CASE WHEN %(refused)s THEN attempts + 1
                                    ELSE LEAST(attempts + 1, GREATEST(1, %(max_attempts)s - 1))
                               END,
                    last_error = %(error)s,
                    next_attempt_at = CASE
                        WHEN %(refused)s AND attempts + 1 >= %(max_attempts)s THEN NULL
                        ELSE now() + make_interval(secs =>
                            LEAST(%(max_seconds)s, %(base_seconds)s * power(2, attempts))
                            * (0.5 + random() / 2)) END
                WHERE event_id = %(event_id)s
                RETURNING next_attempt_at IS NULL
                """,
                {
                    "refused": refused,
                    "error": record.error,
                    "max_attempts": max_attempts,
                    "max_seconds": max_seconds,
                    "base_seconds": base_seconds,
                    "event_id": record.event_id,
                },
            )
            row = db.fetchone()
    return bool(row and row[0])


# --- operators' repairs of held events --------------------------------------------------------
# A head whose attempts are spent is never sent by a relay, so discarding it cannot race with a
# send; a retry only makes a head due, and the relay that sends it records the outcome.

OPERATOR_RELAY = "operator"


def held_events_retry(*, event_ids: Sequence[uuid.UUID | str]) -> int:
    """Sends the failed held events named (a head waiting for its backoff, or one whose
    attempts are spent) again now, with a fresh set of attempts. Returns how many changed."""
    with connection.cursor() as db:
        db.execute(
            """
            UPDATE outbox_held_event SET attempts = 0, next_attempt_at = now()
            WHERE event_id = ANY(%s::uuid[]) AND attempts > 0
            """,
            [list(event_ids)],
        )
        return db.rowcount


def held_events_discard(*, event_ids: Sequence[uuid.UUID | str]) -> int:
    """Gives up on the held events named whose attempts are spent: each gets a DISCARDED
    delivery record and leaves the held set, and its key's next event becomes the head, due
    now. Returns how many were discarded."""
    with connection.cursor() as db:
        db.execute(
            f"""
            WITH held AS (
                DELETE FROM outbox_held_event
                WHERE event_id = ANY(%s::uuid[])
                  AND attempts > 0 AND next_attempt_at IS NULL
                RETURNING event_id, event_transaction_id, event_position, event_created_at
            )
            INSERT INTO outbox_delivery (event_id, outcome, published_at, error, relay,
                                         event_created_at, event_transaction_id,
                                         event_position)
            SELECT held.event_id, 'DISCARDED', greatest(now(), event.created_at), '', %s,
                   held.event_created_at, held.event_transaction_id, held.event_position
            FROM held LEFT JOIN outbox_event AS event ON {HELD_EVENT_ROW_JOIN}
            """,  # noqa: S608 (composed of constants; values are parameters)
            [list(event_ids), OPERATOR_RELAY],
        )
        return db.rowcount


def held_key_release(*, topic: str, key: str) -> int:
    """Lets a held key flow again: discards its events whose attempts are spent and makes a
    head waiting for its backoff due now. Returns how many events it changed."""
    with transaction.atomic(), connection.cursor() as db:
        db.execute(
            """
            SELECT event_id FROM outbox_held_event
            WHERE topic = %s AND key = %s AND attempts > 0 AND next_attempt_at IS NULL
            FOR UPDATE
            """,
            [topic, key],
        )
        discarded = held_events_discard(event_ids=[row[0] for row in db.fetchall()])
        db.execute(
            """
            UPDATE outbox_held_event SET next_attempt_at = now()
            WHERE topic = %s AND key = %s AND next_attempt_at > now()
            """,
            [topic, key],
        )
        return discarded + db.rowcount


def held_event_replay(
    *,
    event_id: uuid.UUID,
    topic: str,
    key: str,
    transaction_id: int,
    position: int,
    created_at: datetime,
) -> bool:
    """Sends a published or discarded event again with its own id: it is held as the last
    event of its key, in the place of a transaction committing now, and the relay sends it
    when its turn comes. `transaction_id`, `position` and `created_at` are the event row's
    own. False when the event is held already."""
    with connection.cursor() as db:
        db.execute(
            f"""
            INSERT INTO outbox_held_event (event_id, shard, topic, key, transaction_id,
                                           position, event_transaction_id, event_position,
                                           event_created_at, attempts, next_attempt_at,
                                           last_error, held_at)
            VALUES (%(event_id)s, {SHARD_SQL.format(key="%(key)s")}, %(topic)s, %(key)s,
                    pg_current_xact_id()::text::bigint, nextval(%(sequence)s),
                    %(transaction_id)s, %(position)s, %(created_at)s, 0, NULL, '', now())
            ON CONFLICT (event_id) DO NOTHING
            """,  # noqa: S608 (composed of constants; values are parameters)
            {
                "event_id": event_id,
                "topic": topic,
                "key": key,
                "sequence": POSITION_SEQUENCE,
                "transaction_id": transaction_id,
                "position": position,
                "created_at": created_at,
            },
        )
        return db.rowcount == 1
