"""The event-log relay's reads and writes: ticks, shards, cursors, batches, delivery records
and held keys. Nothing here updates or deletes an event row.

An event carries the id of the transaction that wrote it (`txid`, set by PostgreSQL at insert).
A tick records a transaction snapshot. The events between tick A and the next tick B (a span)
are those whose transaction had ended when B was taken but not when A was: the events that
became visible between the two ticks, found by short index walks that no long-running read or
write, dead row or key pattern slows down. Spans go in the order of their ticks, the events of
a span in position order (batch_read). A cursor says how far each shard went, as an appended
row.
"""

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import psycopg
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from outbox.models import POSITION_SEQUENCE, OutboxDelivery

# A key belongs to shard (hashtext(key) & 2147483647) % SHARD_COUNT for good: the migration
# that created the cursors wrote this number into them.
SHARD_COUNT = 16
ALL_SHARDS = tuple(range(SHARD_COUNT))
# The first key of the two-key advisory locks by which a relay owns its shards.
SHARD_LOCK_CLASS = 0x6F62_7478
# The first key of the advisory lock each running relay holds while it runs: the relays count
# each other by these locks, to share the shards.
RELAY_LOCK_CLASS = SHARD_LOCK_CLASS + 1
# The advisory lock a relay takes for the moment it takes a tick (tick_take).
TICK_LOCK_CLASS = SHARD_LOCK_CLASS + 2
SHARD_SQL = f"mod(hashtext({{key}}) & 2147483647, {SHARD_COUNT})"
# Where Django's connection keeps its database connection and that one's session process id.
BACKEND_PID_ATTRIBUTE = "outbox_backend_pid"


@dataclass(frozen=True, slots=True)
class Tick:
    id: int
    snapshot: str


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far a group of shards went: every event visible at tick `tick_id` is done, and of
    those that became visible between it and tick `until_tick_id` (when set), the ones up to
    `position`: a span is sent in position order (batch_read)."""

    shards: tuple[int, ...]
    tick_id: int
    until_tick_id: int | None = None
    position: int = 0


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


# A delivery record is never dated before its event (record_time): the reads of one event's
# records look from its created_at on, so that PostgreSQL skips the day partitions of the
# delivery table before it (outbox.selectors). The records migration 0012 made from the claim
# relay's columns carry times from another clock than created_at's (the database's, the
# relay's); the reads allow them this much.
RECORD_CLOCK_MARGIN = timedelta(hours=1)
RECORD_CLOCK_MARGIN_SQL = f"interval '{int(RECORD_CLOCK_MARGIN.total_seconds())} seconds'"


def record_time(event: "LogEvent", moment: datetime) -> datetime:
    """The time a delivery record of `event` carries for `moment`: never before the event's
    created_at. The relay's clock and the publisher's may differ; a record dated before its
    event would put it in a day partition the reads skip, and make a negative lag."""
    return max(moment, event.created_at)


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    event_id: uuid.UUID
    outcome: OutboxDelivery.Outcome
    published_at: datetime
    partition: int | None = None
    offset: int | None = None
    error: str = ""
    # How long the try took, in whole milliseconds (OutboxDelivery.duration_ms).
    duration_ms: int | None = None


def shard_of(key: str) -> int:
    """The shard of `key`, as PostgreSQL computes it."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {SHARD_SQL.format(key='%s')}", [key])
        return int(cursor.fetchone()[0])


def shards_lock(*, shards: Sequence[int], limit: int | None = None) -> list[int]:
    """Takes up to `limit` of the shards no other relay owns, in order, for as long as this
    database session lasts."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT shard FROM unnest(%s::int[]) WITH ORDINALITY AS wanted(shard, place) "
            "WHERE pg_try_advisory_lock(%s, shard) ORDER BY place LIMIT %s",
            [list(shards), SHARD_LOCK_CLASS, limit],
        )
        return [row[0] for row in cursor.fetchall()]


def relay_join(*, relay_id: str) -> None:
    """Counts this session as a running relay (relays_running) until it leaves or ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_lock(%s, hashtext(%s))", [RELAY_LOCK_CLASS, relay_id]
        )


def relay_leave(*, relay_id: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", [RELAY_LOCK_CLASS, relay_id])


def relays_running() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM pg_locks
            WHERE locktype = 'advisory' AND classid = %s::bigint::oid AND objsubid = 2
              AND granted AND database = (SELECT oid FROM pg_database
                                          WHERE datname = current_database())
            """,
            [RELAY_LOCK_CLASS],
        )
        return int(cursor.fetchone()[0])


def shards_unlock(*, shards: Sequence[int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_unlock(%s, shard) FROM unnest(%s::int[]) AS shard",
            [SHARD_LOCK_CLASS, list(shards)],
        )


def backend_pid() -> int:
    """The process id of this connection's database session, asked once per connection (the
    relay checks it before every batch). Asked of the server, not of libpq: behind a pooler
    libpq knows the pooler's id, which pg_backend_pid() in batch_record would never match."""
    connection.ensure_connection()
    database_connection = connection.connection
    known: tuple[object, int] | None = getattr(connection, BACKEND_PID_ATTRIBUTE, None)
    if known is not None and known[0] is database_connection:
        return known[1]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    setattr(connection, BACKEND_PID_ATTRIBUTE, (database_connection, pid))
    return pid


def cursors_read(*, shards: Sequence[int]) -> list[Cursor]:
    """The latest cursor of each shard, shards at the same place grouped into one cursor.

    A cursor inside a span records its place as a position with the txid 0. One with another
    txid was recorded by a version that sent a span in transaction order, up to (txid,
    position): its place says nothing of position order, so its span is sent again from the
    start (the copies reach consumers as redeliveries, which the inbox drops). The txid 0 makes
    such a version read a cursor of this one the same way, never past an event not sent."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT shard, latest.tick_id, latest.until_tick_id, latest.txid::text,
                   latest.position
            FROM unnest(%s::smallint[]) AS shard
            CROSS JOIN LATERAL (
                SELECT tick_id, until_tick_id, txid, position FROM outbox_relay_cursor
                WHERE shard = ANY(shards) ORDER BY id DESC LIMIT 1
            ) AS latest
            """,
            [list(shards)],
        )
        rows = cursor.fetchall()
    return cursors_grouped(
        Cursor(
            shards=(shard,),
            tick_id=tick_id,
            until_tick_id=until_tick_id,
            position=position if txid == "0" else 0,
        )
        for shard, tick_id, until_tick_id, txid, position in rows
    )


def cursors_grouped(cursors: Iterable[Cursor]) -> list[Cursor]:
    """One cursor for all the shards whose cursors are at the same place."""
    places: dict[tuple[int, int | None, int], list[int]] = {}
    for cursor in cursors:
        place = (cursor.tick_id, cursor.until_tick_id, cursor.position)
        places.setdefault(place, []).extend(cursor.shards)
    return [
        Cursor(
            shards=tuple(sorted(shards)),
            tick_id=tick_id,
            until_tick_id=until_tick_id,
            position=position,
        )
        for (tick_id, until_tick_id, position), shards in places.items()
    ]


def tick_read(*, tick_id: int) -> Tick:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, snapshot::text FROM outbox_tick WHERE id = %s", [tick_id])
        row = cursor.fetchone()
    return Tick(id=row[0], snapshot=row[1])


def tick_latest_after(*, tick_id: int) -> Tick | None:
    """The latest tick, if later than `tick_id`: a batch may span many ticks."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, snapshot::text FROM outbox_tick WHERE id > %s ORDER BY id DESC LIMIT 1",
            [tick_id],
        )
        row = cursor.fetchone()
    return Tick(id=row[0], snapshot=row[1]) if row else None


def tick_take(*, after: Tick) -> Tick | None:
    """Records the current snapshot as a tick if an event committed since tick `after` (the
    latest the relay knows), or an operator's replay did; returns the new tick, or None when
    there is nothing new to read.

    The snapshot goes in as a constant: joined from the tick table instead, the planner could
    not bound the walk of the txid index by it and read the whole event table at every tick.
    The walk must be the index's, in order, stopping at the first event found: with no
    statistics yet (a new day's partition before autovacuum first analyzes it, up to a minute)
    the planner scans the whole partition instead, at every tick (6 ms at 10,000 events in
    bench-outbox's one-key run), or with sequential scans off, builds a bitmap of the whole
    range of the index first. As in a span's read (_SPAN_SQL), an event committed since `after`
    is looked for after its xmax and among the transactions it saw running that have ended,
    never from its xmin: a transaction held open would make every tick walk all that committed
    since it began.

    A replayed event is held with the id of the replaying transaction and goes once a tick
    shows that transaction ended (held_heads_due): with no event published meanwhile, that tick
    is taken for it here.

    Relays take ticks one at a time (an advisory lock held until the tick commits, taken
    before its snapshot): a tick's id is drawn after its snapshot, and two relays taking ticks
    at once could otherwise commit a higher id with the older snapshot, and a cursor moving
    from one to the other would read a span again.

    A tick need not reach the disk before the relay reads by it, so its commit does not wait
    for the WAL flush: the cursor that names it commits later, waiting for the flush of the WAL
    up to there, the tick's with it; a tick lost in a crash is named by no recorded cursor.
    In a caller's transaction (a test's) the tick's commit is the caller's, which keeps its
    own durability."""
    settings = {"enable_seqscan": "off", "enable_bitmapscan": "off"}
    if not connection.in_atomic_block:
        settings["synchronous_commit"] = "off"
    rows = _fetch_with_settings(
        settings,
        # Its own statement before the insert: in READ COMMITTED the insert's snapshot is taken
        # when the insert starts, once the lock is held.
        f"""
        SELECT pg_advisory_xact_lock({TICK_LOCK_CLASS}, 0);
        INSERT INTO outbox_tick (snapshot)
        SELECT pg_current_snapshot()
        WHERE EXISTS (
            SELECT 1 FROM outbox_event AS event
            WHERE event.txid >= pg_snapshot_xmax(%(after)s::pg_snapshot)
        ) OR EXISTS (
            SELECT 1 FROM outbox_event AS event
            WHERE event.txid = ANY(ARRAY(
                SELECT running FROM pg_snapshot_xip(%(after)s::pg_snapshot) AS running
                WHERE pg_visible_in_snapshot(running, pg_current_snapshot())))
        ) OR EXISTS (
            SELECT 1 FROM outbox_held_event AS held
            WHERE held.attempts = 0 AND held.next_attempt_at IS NULL
              AND NOT pg_visible_in_snapshot(held.transaction_id::text::xid8,
                                             %(after)s::pg_snapshot)
        )
        RETURNING id, snapshot::text
        """,  # noqa: S608 (constants; values are parameters)
        {"after": after.snapshot},
    )
    return Tick(id=rows[0][0], snapshot=rows[0][1]) if rows else None


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
# Django's connection like BACKEND_PID_ATTRIBUTE. A new connection has a table of its own.
SPAN_ATTRIBUTE = "outbox_relay_span"

_SPAN_TABLE_CREATE = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {SPAN_TABLE} "
    "(position bigint NOT NULL, txid xid8 NOT NULL, created_at timestamptz NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS {SPAN_TABLE}_position_idx ON {SPAN_TABLE} (position)",
)

_SPAN_TABLE_BATCH_SQL = f"""
SELECT {{columns}}
FROM (
    SELECT position, txid, created_at FROM {SPAN_TABLE}
    WHERE position > %(position)s ORDER BY position LIMIT %(limit)s
) AS place
CROSS JOIN LATERAL (
    SELECT * FROM outbox_event AS event
    WHERE event.txid = place.txid AND event.position = place.position
      AND event.created_at = place.created_at
) AS event
ORDER BY place.position
"""  # noqa: S608 (constants only)


def batch_read(
    *, cursor: Cursor, since: Tick, until: Tick, limit: int
) -> tuple[list[LogEvent], bool]:
    """The next events of the span between ticks `since` and `until` after `cursor`, up to
    `limit`, in position order; and whether they are the last of the span.

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
    }
    columns = _EVENT_COLUMNS.format(shard=shard)
    if cursor.until_tick_id is None:
        # Most spans fit in a batch: read whole, and ordered here.
        rows = _fetch(
            _SPAN_SQL.format(columns=columns, shard_filter=shard_filter) + "LIMIT %(limit)s + 1",
            params,
        )
        if len(rows) <= limit:
            return sorted((_log_event(row) for row in rows), key=_by_position), True
    span = (connection.connection, since.id, until.id, cursor.shards)
    if getattr(connection, SPAN_ATTRIBUTE, None) != span:
        places = _SPAN_SQL.format(
            columns="event.position, event.txid, event.created_at", shard_filter=shard_filter
        )
        with transaction.atomic(), connection.cursor() as db:
            for statement in _SPAN_TABLE_CREATE:
                db.execute(statement)
            db.execute(f"TRUNCATE {SPAN_TABLE}")
            db.execute(f"INSERT INTO {SPAN_TABLE} (position, txid, created_at) {places}", params)
            db.execute(f"ANALYZE {SPAN_TABLE}")
        setattr(connection, SPAN_ATTRIBUTE, span)
    rows = _fetch(_SPAN_TABLE_BATCH_SQL.format(columns=columns), params)
    return [_log_event(row) for row in rows], len(rows) < limit


def _by_position(event: "LogEvent") -> int:
    return event.position


def _fetch(sql: str, params: Mapping[str, Any]) -> list[tuple]:
    with connection.cursor() as db:
        db.execute(sql, params)
        return db.fetchall()


def _fetch_with_settings(
    settings: Mapping[str, str], sql: str, params: Mapping[str, Any]
) -> list[tuple]:
    """The rows of the last statement of `sql`, run with `settings` (name: value) for it
    alone. The settings and the statements go in one query string, one round trip: in
    autocommit they run as one transaction, which transaction-local settings last for (in a
    caller's transaction, until that ends). The cursor binds values on the client whatever the
    project's settings (server_side_binding): only then may one execute() carry several
    statements."""
    connection.ensure_connection()
    settings_sql = ", ".join(
        f"set_config('{name}', '{value}', true)" for name, value in settings.items()
    )
    # django-stubs type this as taking a CursorWrapper; it takes a DB-API cursor.
    with connection.make_cursor(
        cast(CursorWrapper, psycopg.ClientCursor(connection.connection))
    ) as db:
        db.execute(f"SELECT {settings_sql};{sql}", params)
        while db.nextset():
            pass
        return db.fetchall()


def _log_event(row: Sequence) -> LogEvent:
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


class ShardLost(Exception):
    """This session no longer holds the shards' locks (it ended, or its locks were dropped):
    another relay may own them now."""


# Whether this session holds the advisory lock of each of the shards %(shards)s. Asked of the
# locks themselves, not of the session's process id alone: behind a pooler in session mode, a
# client's new connection may get the server session of its old one, reset by DISCARD ALL
# (which drops advisory locks), under the same process id.
SHARDS_HELD_SQL = f"""
(SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
   AND classid = {SHARD_LOCK_CLASS}::bigint::oid AND objsubid = 2
   AND objid::bigint = ANY(%(shards)s::bigint[])
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
) = cardinality(%(shards)s::bigint[])"""  # noqa: S608 (constants only)


def batch_record(
    *,
    relay_id: str,
    owner_pid: int,
    records: Sequence[DeliveryRecord],
    held: Sequence[tuple[LogEvent, DeliveryRecord | None]],
    cursor: Cursor,
    retry_seconds: float,
) -> None:
    """In one transaction: the delivery records, the events newly held (a failed head with
    its failure, or an event queued behind a held key) and the cursor's new place.

    Raises ShardLost, having written nothing, if this is no longer the session that locked
    the shards (the connection was lost and opened again), or it no longer holds their locks."""
    with transaction.atomic(), connection.cursor() as db:
        db.execute(
            f"""
            INSERT INTO outbox_relay_cursor (shards, tick_id, until_tick_id, txid, position,
                                             relay)
            SELECT %(shards)s::smallint[], %(tick_id)s, %(until_tick_id)s, '0'::xid8,
                   %(position)s, %(relay)s
            WHERE pg_backend_pid() = %(owner_pid)s AND {SHARDS_HELD_SQL}
            """,
            {
                "shards": list(cursor.shards),
                "tick_id": cursor.tick_id,
                "until_tick_id": cursor.until_tick_id,
                "position": cursor.position,
                "relay": relay_id,
                "owner_pid": owner_pid,
            },
        )
        if db.rowcount != 1:
            raise ShardLost(
                f"this session no longer holds the locks of shards {list(cursor.shards)}"
            )
        deliveries_insert(relay_id=relay_id, records=records)
        if held:
            _held_insert(held, retry_seconds=retry_seconds)


def deliveries_insert(*, relay_id: str, records: Sequence[DeliveryRecord]) -> None:
    if not records:
        return
    with connection.cursor() as db:
        db.execute(
            """
            INSERT INTO outbox_delivery (event_id, outcome, published_at, kafka_partition,
                                         kafka_offset, error, duration_ms, relay)
            SELECT record.*, %s
            FROM unnest(%s::uuid[], %s::varchar[], %s::timestamptz[], %s::integer[],
                        %s::bigint[], %s::text[], %s::integer[]) AS record
            """,
            [
                relay_id,
                [r.event_id for r in records],
                [r.outcome.value for r in records],
                [r.published_at for r in records],
                [r.partition for r in records],
                [r.offset for r in records],
                [r.error for r in records],
                [r.duration_ms for r in records],
            ],
        )


def _held_insert(
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


def held_keys_read(*, shards: Sequence[int]) -> set[tuple[str, str]]:
    with connection.cursor() as db:
        db.execute(
            "SELECT DISTINCT topic, key FROM outbox_held_event WHERE shard = ANY(%s)",
            [list(shards)],
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
    with connection.cursor() as db:
        db.execute(
            f"""
            SELECT event.id, event.aggregatetype, event.aggregateid, event.type,
                   event.payload::text, event.headers, event.topic, event.key, event.created_at,
                   held.transaction_id::text, held.position, held.shard
            FROM outbox_held_event AS held
            JOIN outbox_event AS event ON {HELD_EVENT_ROW_JOIN}
            WHERE held.topic = %s AND held.key = %s
            ORDER BY held.position
            LIMIT %s
            """,  # noqa: S608 (constants; values are parameters)
            [topic, key, limit],
        )
        return [_log_event(row) for row in db.fetchall()]


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
    max_attempts: int,
    base_seconds: float,
    max_seconds: float,
) -> bool:
    """Counts a failed retry of a held head: the next by exponential backoff with jitter, or
    none after `max_attempts` (an operator retries or discards it). Returns whether its
    attempts are now spent."""
    with transaction.atomic():
        deliveries_insert(relay_id=relay_id, records=[record])
        with connection.cursor() as db:
            db.execute(
                """
                UPDATE outbox_held_event
                SET attempts = attempts + 1, last_error = %(error)s,
                    next_attempt_at = CASE WHEN attempts + 1 >= %(max_attempts)s THEN NULL
                        ELSE now() + make_interval(secs =>
                            LEAST(%(max_seconds)s, %(base_seconds)s * power(2, attempts))
                            * (0.5 + random() / 2)) END
                WHERE event_id = %(event_id)s
                RETURNING next_attempt_at IS NULL
                """,
                {
                    "error": record.error,
                    "max_attempts": max_attempts,
                    "max_seconds": max_seconds,
                    "base_seconds": base_seconds,
                    "event_id": record.event_id,
                },
            )
            row = db.fetchone()
    return bool(row and row[0])


# The name of the cursors that start every shard at a tick with nothing done yet.
MIGRATION_CURSOR = "migration"


def event_log_start_afresh() -> None:
    """Forgets every tick, cursor, delivery record and held event and starts every shard now,
    as migration 0009 does: for a database whose outbox is empty (a test's or a scenario run's).
    Refuses a database that holds events."""
    with transaction.atomic(), connection.cursor() as db:
        db.execute("LOCK TABLE outbox_event IN SHARE MODE")
        db.execute("SELECT EXISTS (SELECT 1 FROM outbox_event)")
        if db.fetchone()[0]:
            raise RuntimeError("the outbox holds events: the event log cannot start afresh")
        db.execute("TRUNCATE outbox_relay_cursor, outbox_tick, outbox_delivery, outbox_held_event")
        db.execute("INSERT INTO outbox_tick (snapshot) VALUES (pg_current_snapshot()) RETURNING id")
        tick_id = db.fetchone()[0]
        db.execute(
            """
            INSERT INTO outbox_relay_cursor (shards, tick_id, txid, position, relay)
            VALUES (%s::smallint[], %s, '0'::xid8, 0, %s)
            """,
            [list(ALL_SHARDS), tick_id, MIGRATION_CURSOR],
        )


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
            INSERT INTO outbox_delivery (event_id, outcome, published_at, error, relay)
            SELECT held.event_id, 'DISCARDED', greatest(now(), event.created_at), '', %s
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
