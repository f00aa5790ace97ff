"""Celery tasks of the inbox: thin wrappers around services. Their names are stable; beat
runs them from the entries of inbox/beat.py."""

from celery import shared_task

from inbox.services.retention import inbox_messages_purge_processed
from inbox.services.retries import inbox_messages_retry_due


@shared_task(name="inbox.tasks.retry_due", ignore_result=True)
def retry_due() -> dict[str, int]:
    """Runs the handlers of PENDING rows whose next attempt is due."""
    return inbox_messages_retry_due()


@shared_task(name="inbox.tasks.purge_processed", ignore_result=True)
def purge_processed() -> int:
    """Deletes DONE rows older than INBOX["RETENTION_DAYS"], in bounded batches."""
    return inbox_messages_purge_processed()
