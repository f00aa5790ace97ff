"""Retention: published events are deleted once OUTBOX_RETENTION_DAYS have passed, and the
relay's ticks and cursors once no shard needs them."""

from datetime import datetime

from django.db import connection, transaction

from outbox.services.event_log import SHARD_COUNT


def outbox_event_log_purge(*, older_than: datetime, batch_size: int) -> dict[str, int]:
    """Deletes what the event-log relay no longer needs: the events created before
    `older_than` that it delivered, with their delivery records (one bounded batch per
    transaction), the cursor rows every shard has moved past, and the ticks before the oldest
    shard's cursor."""
    deleted = {"events": 0, "deliveries": 0, "cursors": 0, "ticks": 0}
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT event.id FROM outbox_event AS event
                WHERE event.created_at < %s
                  AND EXISTS (
                      SELECT 1 FROM outbox_delivery AS delivery
                      WHERE delivery.event_id = event.id AND delivery.outcome = 'PUBLISHED'
                  )
                  AND NOT EXISTS (
                      SELECT 1 FROM outbox_held_event AS held WHERE held.event_id = event.id
                  )
                LIMIT %s
                """,
                [older_than, batch_size],
            )
            ids = [row[0] for row in cursor.fetchall()]
            cursor.execute("DELETE FROM outbox_event WHERE id = ANY(%s::uuid[])", [ids])
            deleted["events"] += cursor.rowcount
            cursor.execute("DELETE FROM outbox_delivery WHERE event_id = ANY(%s::uuid[])", [ids])
            deleted["deliveries"] += cursor.rowcount
        if len(ids) < batch_size:
            break
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
        deleted["cursors"], deleted["ticks"] = cursor.fetchone()
    return deleted


# --- operators' repairs ----------------------------------------------------------------------
# Each refuses an illegal transition with IllegalTransition. The console records who did what.
