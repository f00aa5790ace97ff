"""Spans: the events that became visible between two ticks, read in the order they are
sent."""

import json
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

from django.db import connection, transaction
from psycopg.types.datetime import TimestamptzLoader

from outbox.services.event_log.cursors import Cursor
from outbox.services.event_log.shards import ALL_SHARDS, SHARD_SQL
from outbox.services.event_log.ticks import Tick


class LogEvent(NamedTuple):
    """An event as the relay sends it. A tuple, not a dataclass: the relay makes one per event
    it reads, thousands a second, and a tuple is the cheapest object to make."""

    id: uuid.UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    # The stored JSON as PostgreSQL prints it: sent as it is, never parsed on the hot path.
    payload_json: str
    # The event's own headers, the same way: most events have none ("{}").
    headers_json: str
    topic: str
    key: str
    created_at: datetime
    txid: int
    position: int
    shard: int
    # The event's id and creation time as its record's headers carry them (str(id), and
    # created_at's isoformat() in UTC), formatted by PostgreSQL as it reads the event: in
    # Python they would cost more than the rest of the record. Empty for an event made in
    # code, whose record formats them itself.
    id_text: str = ""
    created_at_text: str = ""

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.headers_json == NO_HEADERS else json.loads(self.headers_json)


# The text of an event's headers when it has none of its own.
NO_HEADERS = "{}"

# LogEvent's id_text and created_at_text, from `event`. isoformat() leaves out a fraction of
# zero microseconds.
HEADER_TEXT_COLUMNS = """
event.id::text,
to_char(event.created_at AT TIME ZONE 'UTC',
        CASE WHEN mod(date_part('microseconds', event.created_at)::bigint, 1000000) = 0
             THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'
             ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END)"""

# The columns of an event as the relay sends it, from `event` (and `shard` as SHARD_SQL's).
_EVENT_COLUMNS = f"""
event.id, event.aggregatetype, event.aggregateid, event.type, event.payload::text,
event.headers::text, event.topic, event.key, event.created_at, event.txid::text::bigint,
event.position, {{shard}} AS shard, {HEADER_TEXT_COLUMNS}"""

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
# The next batch of the span table's events, as the relay sends them.
_SPAN_TABLE_EVENTS_SQL = _SPAN_TABLE_BATCH_SQL.format(
    columns=_EVENT_COLUMNS.format(shard=SHARD_SQL.format(key="event.key"))
)


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
        rows = event_rows_fetch(_SPAN_WITHIN_BYTES_SQL.format(span=span_sql), params)
        if len(rows) <= limit and not _past(rows, max_bytes):
            return sorted(map(log_event_from_row, rows), key=_by_position), True
    span = _session_span(cursor, since, until)
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
    rows = event_rows_fetch(_SPAN_TABLE_EVENTS_SQL, params)
    return _span_table_batch(rows, limit=limit, max_bytes=max_bytes)


def batch_prefetch(
    *, cursor: Cursor, since: Tick, until: Tick, limit: int, max_bytes: int, executor: Executor
) -> "Future[tuple[list[LogEvent], bool]] | None":
    """What batch_read(cursor=..., ...) will return, read on a thread of `executor` from the
    span table of this session, which batch_read filled for the span; None when the next batch
    is not read from that table (the cursor is at a span's start).

    The thread uses this session (the table is the session's), so the caller must not use the
    connection until the read is done (concurrent.futures.wait()). Meanwhile PostgreSQL reads
    the batch while the relay sends the one before it."""
    span = _session_span(cursor, since, until)
    if cursor.until_tick_id is None or getattr(connection, SPAN_ATTRIBUTE, None) != span:
        return None
    params = {"position": cursor.position, "limit": limit, "max_bytes": max_bytes}
    session = connection.connection

    def read() -> tuple[list[LogEvent], bool]:
        with session.cursor() as db:
            db.adapters.register_loader("timestamptz", TimestamptzLoader)
            db.execute(_SPAN_TABLE_EVENTS_SQL, params)
            rows = db.fetchall()
        return _span_table_batch(rows, limit=limit, max_bytes=max_bytes)

    return executor.submit(read)


def _session_span(cursor: Cursor, since: Tick, until: Tick) -> tuple:
    """Which span the session's table must hold for `cursor` (see SPAN_ATTRIBUTE)."""
    return (connection.connection, since.id, until.id, cursor.shards)


def _span_table_batch(
    rows: Sequence[Sequence], *, limit: int, max_bytes: int
) -> tuple[list[LogEvent], bool]:
    return list(map(log_event_from_row, rows)), len(rows) < limit and not _past(rows, max_bytes)


def _past(rows: Sequence[Sequence], max_bytes: int) -> bool:
    """Whether `rows` (each ending with the running total of stored bytes) stopped at the
    byte bound, with more events after them."""
    return bool(rows) and rows[-1][-1] > max_bytes


_by_position = attrgetter("position")


def event_rows_fetch(sql: str, params: Mapping[str, Any] | Sequence[Any]) -> list[tuple]:
    """The rows of a read of events (each as log_event_from_row takes it). Their times are
    made by psycopg's own loader, in C, not Django's (a Python subclass of it that sets the
    zone, which the connection's UTC already gives): a tenth of the cost per row."""
    with connection.cursor() as db:
        db.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        db.execute(sql, params)
        return db.fetchall()


_EVENT_FIELD_COUNT = len(LogEvent._fields)


def log_event_from_row(row: Sequence) -> LogEvent:
    """The event of a row whose first columns are LogEvent's fields, in their order."""
    return LogEvent._make(row[:_EVENT_FIELD_COUNT])
