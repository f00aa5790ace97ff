"""Ticks: the transaction snapshots between which the relay reads the events that became
visible."""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import psycopg
from django.db import connection
from django.db.backends.utils import CursorWrapper

from outbox.services.event_log.shards import SHARD_LOCK_CLASS

# The advisory lock a relay takes for the moment it takes a tick (tick_take).
TICK_LOCK_CLASS = SHARD_LOCK_CLASS + 2


@dataclass(frozen=True, slots=True)
class Tick:
    id: int
    snapshot: str
    taken_at: datetime


# A tick's columns, in Tick's order.
TICK_COLUMNS = "id, snapshot::text, taken_at"


def tick_read(*, tick_id: int) -> Tick:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {TICK_COLUMNS} FROM outbox_tick WHERE id = %s", [tick_id])  # noqa: S608
        row = cursor.fetchone()
    if row is None:
        # Retention keeps every tick a shard's latest cursor names.
        raise LookupError(f"outbox tick {tick_id} does not exist")
    return Tick(*row)


def tick_latest_after(*, tick_id: int) -> Tick | None:
    """The latest tick, if later than `tick_id`: a batch may span many ticks."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {TICK_COLUMNS} FROM outbox_tick WHERE id > %s ORDER BY id DESC LIMIT 1",  # noqa: S608
            [tick_id],
        )
        row = cursor.fetchone()
    return Tick(*row) if row else None


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
    range of the index first. As in a span's read (spans._SPAN_SQL), an event committed since
    `after` is looked for after its xmax and among the transactions it saw running that have
    ended, never from its xmin: a transaction held open would make every tick walk all that
    committed since it began.

    A replayed event is held with the id of the replaying transaction and goes once a tick
    shows that transaction ended (held.held_heads_due): with no event published meanwhile, that tick
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
        RETURNING {TICK_COLUMNS}
        """,  # noqa: S608 (constants; values are parameters)
        {"after": after.snapshot},
    )
    return Tick(*rows[0]) if rows else None


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
