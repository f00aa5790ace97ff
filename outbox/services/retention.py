"""Retention: published events are deleted once OUTBOX_RETENTION_DAYS have passed."""

from datetime import datetime

from django.db import connection, transaction


def outbox_events_purge_published(*, older_than: datetime, batch_size: int) -> int:
    """Deletes DONE events published before older_than, one bounded batch per transaction."""
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                DELETE FROM outbox_event WHERE id IN (
                    SELECT id FROM outbox_event
                    WHERE status = 'DONE' AND published_at < %s
                    LIMIT %s FOR UPDATE SKIP LOCKED
                )
                """,
                [older_than, batch_size],
            )
            batch = cursor.rowcount
        deleted += batch
        if batch < batch_size:
            return deleted


# --- operators' repairs ----------------------------------------------------------------------
# Each refuses an illegal transition with IllegalTransition. The console records who did what.
