"""Retention: DONE rows deleted once older than INBOX_RETENTION_DAYS, in short batches."""

import datetime as dt

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from inbox.services.recording import DONE


def inbox_messages_purge_processed(
    *,
    older_than: dt.datetime | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
) -> int:
    """Deletes DONE rows processed before `older_than` (default: INBOX_RETENTION_DAYS ago),
    `batch_size` rows per short transaction, at most `max_batches` batches. Returns the count."""
    older_than = older_than or timezone.now() - dt.timedelta(days=settings.INBOX_RETENTION_DAYS)
    batch_size = batch_size or settings.INBOX_RETENTION_BATCH_SIZE
    max_batches = max_batches or settings.INBOX_RETENTION_MAX_BATCHES
    deleted = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                DELETE FROM inbox_message WHERE id IN (
                    SELECT id FROM inbox_message
                    WHERE status = %s AND processed_at < %s
                    ORDER BY processed_at LIMIT %s
                    FOR UPDATE SKIP LOCKED
                )
                """,
                [DONE, older_than, batch_size],
            )
            count = cursor.rowcount
        deleted += count
        if count < batch_size:
            break
    return deleted
