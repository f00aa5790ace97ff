"""Thin Celery tasks, each calling one service. Their names are stable; beat runs them from the
entries of outbox/beat.py."""

import logging
import socket
from datetime import timedelta

from billiard.process import current_process
from celery import shared_task
from django.utils import timezone

from outbox.conf import outbox_settings
from outbox.log_relay import LogRelay
from outbox.relay import transactional_id_for
from outbox.services.retention import outbox_event_log_purge

logger = logging.getLogger(__name__)


def _worker_slot() -> str:
    # Stable across restarts of the same worker child, so a restarted relay fences its zombie.
    index = getattr(current_process(), "index", None)
    return f"{socket.gethostname()}-{index if index is not None else 'main'}"


@shared_task(name="outbox.tasks.relay", ignore_result=True)
def relay() -> int:
    """Publishes due events, looping while batches come back full."""
    log_relay = LogRelay(transactional_id=transactional_id_for(_worker_slot()))
    try:
        return log_relay.run().published
    finally:
        # The worker keeps its database session: the shards go back for the next run, on
        # whichever worker it lands.
        log_relay.close()


@shared_task(name="outbox.tasks.purge_published", ignore_result=True)
def purge_published() -> int:
    older_than = timezone.now() - timedelta(days=outbox_settings.RETENTION_DAYS)
    batch_size = outbox_settings.RETENTION_BATCH_SIZE
    return outbox_event_log_purge(older_than=older_than, batch_size=batch_size)["events"]
