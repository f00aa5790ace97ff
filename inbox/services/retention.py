"""Retention: DONE rows deleted once older than INBOX["RETENTION_DAYS"], in short batches."""

import datetime as dt

from django.db import connection, transaction
from django.utils import timezone

from inbox.conf import inbox_settings
from inbox.services.recording import DONE


def inbox_messages_purge_processed(
    *,
    older_than: dt.datetime | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
) -> int:
    """Deletes DONE rows processed before `older_than` (default: INBOX["RETENTION_DAYS"] ago),
    `batch_size` rows per short transaction, at most `max_batches` batches. Returns the count."""
    older_than = older_than or timezone.now() - dt.timedelta(days=inbox_settings.RETENTION_DAYS)
    batch_size = batch_size or inbox_settings.RETENTION_BATCH_SIZE
    max_batches = max_batches or inbox_settings.RETENTION_MAX_BATCHES
    deleted = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cursor:
            # The batch is chosen once, in a MATERIALIZED CTE: as `id IN (subquery)` the
            # planner may run the LIMIT subquery again per row of a nested loop, and a batch
            # then deleted more than `batch_size` rows.
            cursor.execute(
                """
                WITH batch AS MATERIALIZED (
                    SELECT id FROM inbox_message
                    WHERE status = %s AND processed_at < %s
                    ORDER BY processed_at LIMIT %s
                    FOR UPDATE SKIP LOCKED
                )
                DELETE FROM inbox_message USING batch WHERE inbox_message.id = batch.id
                """,
                [DONE, older_than, batch_size],
            )
            count = cursor.rowcount
        deleted += count
        if count < batch_size:
            break
    return deleted
