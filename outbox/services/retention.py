"""Retention: an event goes once OUTBOX["RETENTION_DAYS"] have passed, the relay is past it and
its key is not held on it; its delivery records go a day after the events they describe. Both
go by dropping whole day partitions (outbox.services.partitions); only the DEFAULT partitions
are deleted from row by row. Then the relay's ticks and cursors no shard needs any longer, and
the partitions of the days ahead are created."""

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from psycopg import sql

from outbox.selectors import outbox_log_cursor_snapshot
from outbox.services.event_log.shards import SHARD_COUNT
from outbox.services.partitions import (
    PartitionLocked,
    default_partition,
    partition_drop,
    partitions_create_ahead,
    partitions_read,
)

logger = logging.getLogger(__name__)

EVENTS, DELIVERIES = "outbox_event", "outbox_delivery"
# The relay is done with an event when it was delivered or discarded, or is held. Every event
# committed before the xmin of the oldest shard cursor's snapshot is (outbox.services.
# event_log.ticks); one committed later is when it has a final delivery record. The relay keeps its
# cursor where its last full batch ended, so after the traffic stops the last events of a
# day are found done by their records alone. So the events not done yet are a range of the
# (txid, position) index from that xmin, each looked up in the records: a short range, as a
# rule, for a day long past.
NOT_DONE = """
event.txid >= pg_snapshot_xmin(%(snapshot)s::pg_snapshot)
AND NOT EXISTS (
    SELECT 1 FROM outbox_delivery AS record
    WHERE record.event_id = event.id AND record.outcome IN ('PUBLISHED', 'DISCARDED')
)
"""
# Whether the event of the statement's one event table is held. The held set is small: its
# ids are looked up in the BRIN index on the id of the partition (a semi-join could read the
# whole partition).
HELD = "id = ANY(ARRAY(SELECT event_id FROM outbox_held_event))"

# Whether the relay is done with every event of a partition but those held. It runs again
# under the lock that holds back every publish(): an event that committed while the drop
# waited for the lock is not done.
ALL_DONE = (
    "SELECT NOT EXISTS (SELECT 1 FROM {partition} AS event"  # noqa: S608 (constants)
    f" WHERE {NOT_DONE} AND NOT {HELD})"
)
# A delivery record lives a day longer than the partitions of the events it describes, so that
# an event written just after midnight by a clock ahead of the relay's keeps its record.
DELIVERY_GRACE = timedelta(days=1)


def outbox_event_log_purge(*, older_than: datetime, batch_size: int) -> dict[str, int]:
    """Drops or deletes what the event-log relay no longer needs, and creates the partitions
    of the days ahead; returns what went (events, delivery records, partitions, cursor rows
    and ticks) and how many partitions were created. A partition whose lock does not come in
    time stays for the next run."""
    deleted = {"events": 0, "deliveries": 0, "partitions": 0, "cursors": 0, "ticks": 0}
    created = 0
    params = {"snapshot": outbox_log_cursor_snapshot(), "older_than": older_than}
    try:
        _event_partitions_drop(older_than, params, deleted)
        _delivery_partitions_drop(older_than, deleted)
    except PartitionLocked as error:
        logger.warning("Outbox retention left a partition for the next run: %s", error)
    _defaults_delete(params, batch_size, deleted)
    deleted["cursors"], deleted["ticks"] = _cursors_and_ticks_delete()
    for table in (EVENTS, DELIVERIES):
        try:
            created += len(partitions_create_ahead(table=table))
        except PartitionLocked as error:
            logger.warning("Outbox retention could not create a partition of %s: %s", table, error)
    return deleted | {"partitions_created": created}


def _event_partitions_drop(
    older_than: datetime, params: dict[str, Any], deleted: dict[str, int]
) -> None:
    for partition in partitions_read(table=EVENTS):
        if partition.upper is None or partition.upper > older_than:
            continue
        # Checked first without the lock, so that a day not done is not locked for nothing.
        with connection.cursor() as cursor:
            cursor.execute(
                sql.SQL(ALL_DONE).format(partition=sql.Identifier(partition.name)), params
            )
            if not cursor.fetchone()[0]:
                continue
        dropped = partition_drop(
            table=EVENTS,
            partition=partition,
            ready=sql.SQL(ALL_DONE),
            keep=sql.SQL(HELD),
            params=params,
        )
        if dropped is not None:
            deleted["events"] += dropped
            deleted["partitions"] += 1
            logger.info("Outbox retention dropped %s (%d events)", partition.name, dropped)


def _delivery_partitions_drop(older_than: datetime, deleted: dict[str, int]) -> None:
    event_partitions = [
        partition for partition in partitions_read(table=EVENTS) if not partition.is_default
    ]
    for partition in partitions_read(table=DELIVERIES):
        if partition.upper is None or partition.upper > older_than:
            continue
        # Every event that may have a record here is dropped already, or in the DEFAULT
        # partition, whose records are kept.
        if any(
            event_partition.lower is None
            or event_partition.lower < partition.upper + DELIVERY_GRACE
            for event_partition in event_partitions
        ):
            break
        dropped = partition_drop(
            table=DELIVERIES,
            partition=partition,
            ready=sql.SQL("SELECT true"),
            keep=sql.SQL("event_id = ANY(ARRAY(SELECT id FROM {}))").format(
                sql.Identifier(default_partition(EVENTS))
            ),
        )
        if dropped is not None:
            deleted["deliveries"] += dropped
            deleted["partitions"] += 1


def _defaults_delete(params: dict[str, Any], batch_size: int, deleted: dict[str, int]) -> None:
    """Row by row, in bounded batches: the DEFAULT partitions (rows beat's maintenance had no
    partition for, events kept when their partition went), and the ids callers gave."""
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"""
                DELETE FROM outbox_event_default WHERE id IN (
                    SELECT id FROM outbox_event_default AS event
                    WHERE created_at < %(older_than)s AND NOT ({NOT_DONE}) AND NOT {HELD}
                    LIMIT %(limit)s
                )
                RETURNING id
                """,  # noqa: S608 (constants)
                {**params, "limit": batch_size},
            )
            ids = [row[0] for row in cursor.fetchall()]
            deleted["events"] += len(ids)
            cursor.execute("DELETE FROM outbox_delivery WHERE event_id = ANY(%s::uuid[])", [ids])
            deleted["deliveries"] += cursor.rowcount
        if len(ids) < batch_size:
            break
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            DELETE FROM outbox_delivery_default AS record
            WHERE published_at < %(older_than)s
              AND NOT EXISTS (SELECT 1 FROM outbox_event AS event WHERE event.id = record.event_id)
            """,
            params,
        )
        deleted["deliveries"] += cursor.rowcount
        # A given id's event has the given id's creation time: looked for in the partition of
        # its day only (the event table has no B-tree on the id).
        cursor.execute(
            """
            DELETE FROM outbox_event_given_id AS given
            WHERE created_at < %(older_than)s
              AND NOT EXISTS (
                  SELECT 1 FROM outbox_event AS event
                  WHERE event.id = given.id AND event.created_at = given.created_at
              )
            """,
            params,
        )


def _cursors_and_ticks_delete() -> tuple[int, int]:
    with transaction.atomic(), connection.cursor() as cursor:
        # Each shard's latest cursor row; every older row is the past of all shards.
        cursor.execute(
            """
            WITH latest AS (
                SELECT max(cursor.id) AS id
                FROM generate_series(0, %s - 1) AS shard
                JOIN outbox_relay_cursor AS cursor ON shard = ANY(cursor.shards)
                GROUP BY shard
            ),
            oldest AS (
                SELECT min(latest.id) AS id, min(cursor.tick_id) AS tick_id
                FROM latest JOIN outbox_relay_cursor AS cursor ON cursor.id = latest.id
            ),
            cursors AS (
                DELETE FROM outbox_relay_cursor WHERE id < (SELECT id FROM oldest) RETURNING 1
            ),
            ticks AS (
                DELETE FROM outbox_tick WHERE id < (SELECT tick_id FROM oldest) RETURNING 1
            )
            SELECT (SELECT count(*) FROM cursors), (SELECT count(*) FROM ticks)
            """,
            [SHARD_COUNT],
        )
        cursors, ticks = cursor.fetchone()
    return cursors, ticks
