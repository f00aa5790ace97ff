"""A sent batch written down: its delivery records, the events it holds and its cursor's new
place, in one transaction."""

from collections.abc import Sequence

from django.db import connection, transaction

from outbox.services.event_log.cursors import Cursor
from outbox.services.event_log.deliveries import DeliveryRecord, deliveries_insert
from outbox.services.event_log.held import held_insert
from outbox.services.event_log.shards import SHARDS_HELD_SQL, ShardLost
from outbox.services.event_log.spans import LogEvent


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
            held_insert(held, retry_seconds=retry_seconds)
