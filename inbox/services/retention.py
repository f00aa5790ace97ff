"""Retention: DONE rows deleted once older than INBOX["RETENTION_DAYS"], in short batches,
each with its attempt rows (inbox.models.InboxAttempt)."""

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
    """Deletes DONE rows processed before `older_than` (default: INBOX["RETENTION_DAYS"] ago)
    and their attempts, `batch_size` rows per short transaction, at most `max_batches`
    batches. Returns the count of rows (messages) deleted."""
    older_than = older_than or timezone.now() - dt.timedelta(days=inbox_settings.RETENTION_DAYS)
    batch_size = batch_size or inbox_settings.RETENTION_BATCH_SIZE
    max_batches = max_batches or inbox_settings.RETENTION_MAX_BATCHES
    deleted = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cursor:
            # The batch is chosen once, in a MATERIALIZED CTE: as `id IN (subquery)` the
            # planner may run the LIMIT subquery again per row of a nested loop, and a batch
            # then deleted more than `batch_size` rows. The messages' attempts go in the same
            # statement: no attempt outlives its message.
            cursor.execute(
                """
                WITH batch AS MATERIALIZED (
                    SELECT id FROM inbox_message
                    WHERE status = %s AND processed_at < %s
                    ORDER BY processed_at LIMIT %s
                    FOR UPDATE SKIP LOCKED
                ), messages AS (
                    DELETE FROM inbox_message USING batch WHERE inbox_message.id = batch.id
                    RETURNING inbox_message.id
                ), attempts AS (
                    DELETE FROM inbox_attempt USING messages
                    WHERE inbox_attempt.message_id = messages.id
                )
                SELECT count(*) FROM messages
                """,
                [DONE, older_than, batch_size],
            )
            row = cursor.fetchone()
            count = row[0] if row else 0
        deleted += count
        if count < batch_size:
            break
    return deleted
