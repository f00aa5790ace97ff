"""Cursors: how far each group of shards went, as appended rows."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db import connection, transaction

from outbox.services.event_log.shards import ALL_SHARDS


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far a group of shards went: every event visible at tick `tick_id` is done, and of
    those that became visible between it and tick `until_tick_id` (when set), the ones up to
    `position`: a span is sent in position order (spans.batch_read)."""

    shards: tuple[int, ...]
    tick_id: int
    until_tick_id: int | None = None
    position: int = 0


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
