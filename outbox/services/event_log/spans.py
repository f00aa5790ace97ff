"""Spans: the events that became visible between two ticks, read in the order they are
sent."""

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from outbox.services.event_log.cursors import Cursor
from outbox.services.event_log.shards import ALL_SHARDS, SHARD_SQL
from outbox.services.event_log.ticks import Tick


@dataclass(frozen=True, slots=True)
class LogEvent:
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
    txid: int
    position: int
    shard: int


# The columns of an event as the relay sends it, from `event` (and `shard` as SHARD_SQL's).
_EVENT_COLUMNS = """
event.id, event.aggregatetype, event.aggregateid, event.type, event.payload::text,
event.headers, event.topic, event.key, event.created_at, event.txid::text, event.position,
{shard} AS shard"""

# The events of a span: those whose transaction ended between tick `since` and tick `until`.
# A transaction is not visible in `since` when it began after it (txid >= its xmax) or was
# running then (its xip list); each part is a short walk of outbox_event_txid_idx. What
# committed before `since` is never walked: a writer that keeps a transaction open (an xid
# held, pinning every snapshot's xmin) does not make every read walk again all that committed
# since it began. Of the xids running at `since`, only those that have ended by `until` are
# looked up: an open transaction's own uncommitted rows are not walked at every span.
_SPAN_SQL = """
SELECT {columns}
FROM outbox_event AS event
WHERE event.txid >= pg_snapshot_xmax(%(since)s::pg_snapshot)
  AND event.txid < pg_snapshot_xmax(%(until)s::pg_snapshot)
  AND pg_visible_in_snapshot(event.txid, %(until)s::pg_snapshot)
  {shard_filter}
UNION ALL
SELECT {columns}
FROM outbox_event AS event
WHERE event.txid = ANY(ARRAY(
        SELECT running FROM pg_snapshot_xip(%(since)s::pg_snapshot) AS running
        WHERE pg_visible_in_snapshot(running, %(until)s::pg_snapshot)))
  {shard_filter}
"""

# A span larger than a batch is sent from a table of this session (no WAL, gone with the
# session) that lists its events' places in position order, filled once per span: sorting
# the span again for each batch would read it whole each time. Each batch reads the next
# places and each one's row through the event table's index in the partition of its day.
SPAN_TABLE = "outbox_relay_span"
# Which span the session's table holds: (database connection, since, until, shards), kept on
# Django's connection like shards.BACKEND_PID_ATTRIBUTE. A new connection has a table of its own.
SPAN_ATTRIBUTE = "outbox_relay_span"

_SPAN_TABLE_CREATE = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {SPAN_TABLE} (position bigint NOT NULL, "
    "txid xid8 NOT NULL, created_at timestamptz NOT NULL, stored_bytes integer NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS {SPAN_TABLE}_position_idx ON {SPAN_TABLE} (position)",
)

_SPAN_TABLE_BATCH_SQL = f"""
SELECT {{columns}}, place.running_bytes
FROM (
    SELECT * FROM (
        SELECT position, txid, created_at, stored_bytes,
               sum(stored_bytes) OVER (ORDER BY position ROWS UNBOUNDED PRECEDING)
                   AS running_bytes
        FROM (
            SELECT * FROM {SPAN_TABLE}
            WHERE position > %(position)s ORDER BY position LIMIT %(limit)s
        ) AS next
    ) AS sized
    WHERE running_bytes - stored_bytes < %(max_bytes)s
) AS place
CROSS JOIN LATERAL (
    SELECT * FROM outbox_event AS event
    WHERE event.txid = place.txid AND event.position = place.position
      AND event.created_at = place.created_at
) AS event
ORDER BY place.position
"""  # noqa: S608 (constants only)


# A span's events with the size of each payload as PostgreSQL stores it (compressed when large;
# read without decompressing it) and their running total in the order read. The events up to
# the one that brings the total past %(max_bytes)s are returned, never none: the payloads that
# would not be sent are never converted to text for the relay.
_SPAN_WITHIN_BYTES_SQL = """
SELECT * FROM (
    SELECT span.*, sum(span.stored_bytes) OVER (ROWS UNBOUNDED PRECEDING) AS running_bytes
    FROM ({span} LIMIT %(limit)s + 1) AS span
) AS span
WHERE span.running_bytes - span.stored_bytes < %(max_bytes)s
"""
_STORED_BYTES = "pg_column_size(event.payload) AS stored_bytes"


def batch_read(
    *, cursor: Cursor, since: Tick, until: Tick, limit: int, max_bytes: int
) -> tuple[list[LogEvent], bool]:
    """The next events of the span between ticks `since` and `until` after `cursor`, up to
    `limit` events and about `max_bytes` of payload (at least one event), in position order;
    and whether they are the last of the span.

    Position order is the order in which the events were written (a sequence drawn at insert).
    Within a span it is commit order for writers that serialize on the key (a transaction that
    takes the aggregate's lock before it publishes), whatever order their transaction ids came
    in: a transaction gets its id at its first write, which may precede the lock. Across spans
    the order is the spans' own, which is commit order."""
    shard = SHARD_SQL.format(key="event.key")
    shard_filter = "" if cursor.shards == ALL_SHARDS else f"AND {shard} = ANY(%(shards)s)"
    params: dict[str, Any] = {
        "since": since.snapshot,
        "until": until.snapshot,
        "shards": list(cursor.shards),
        "position": cursor.position,
        "limit": limit,
        "max_bytes": max_bytes,
    }
    columns = _EVENT_COLUMNS.format(shard=shard)
    if cursor.until_tick_id is None:
        # Most spans fit in a batch: read whole, and ordered here.
        span_sql = _SPAN_SQL.format(
            columns=f"{columns}, {_STORED_BYTES}", shard_filter=shard_filter
        )
        rows = _fetch(_SPAN_WITHIN_BYTES_SQL.format(span=span_sql), params)
        if len(rows) <= limit and not _past(rows, max_bytes):
            return sorted((log_event_from_row(row) for row in rows), key=_by_position), True
    span = (connection.connection, since.id, until.id, cursor.shards)
    if getattr(connection, SPAN_ATTRIBUTE, None) != span:
        places = _SPAN_SQL.format(
            columns=f"event.position, event.txid, event.created_at, {_STORED_BYTES}",
            shard_filter=shard_filter,
        )
        with transaction.atomic(), connection.cursor() as db:
            for statement in _SPAN_TABLE_CREATE:
                db.execute(statement)
            db.execute(f"TRUNCATE {SPAN_TABLE}")
            db.execute(
                f"INSERT INTO {SPAN_TABLE} (position, txid, created_at, stored_bytes) {places}",
                params,
            )
            db.execute(f"ANALYZE {SPAN_TABLE}")
        setattr(connection, SPAN_ATTRIBUTE, span)
    rows = _fetch(_SPAN_TABLE_BATCH_SQL.format(columns=columns), params)
    return [log_event_from_row(row) for row in rows], len(rows) < limit and not _past(
        rows, max_bytes
    )


def _past(rows: Sequence[Sequence], max_bytes: int) -> bool:
    """Whether `rows` (each ending with the running total of stored bytes) stopped at the
    byte bound, with more events after them."""
    return bool(rows) and rows[-1][-1] > max_bytes


def _by_position(event: "LogEvent") -> int:
    return event.position


def _fetch(sql: str, params: Mapping[str, Any]) -> list[tuple]:
    with connection.cursor() as db:
        db.execute(sql, params)
        return db.fetchall()


def log_event_from_row(row: Sequence) -> LogEvent:
    return LogEvent(
        id=row[0],
        aggregate_type=row[1],
        aggregate_id=row[2],
        event_type=row[3],
        payload_json=row[4],
        headers=json.loads(row[5]) if isinstance(row[5], str) else row[5],
        topic=row[6],
        key=row[7],
        created_at=row[8],
        txid=int(row[9]),
        position=row[10],
        shard=row[11],
    )
