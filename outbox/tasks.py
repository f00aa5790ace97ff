"""Thin Celery tasks, each calling one service. Their names are stable; beat runs them from the
entries of outbox/beat.py."""

import logging
import socket
from datetime import timedelta

from billiard.process import current_process
from celery import Task, shared_task
from django.utils import timezone

from outbox.conf import outbox_settings
from outbox.log_relay import LogRelay
from outbox.relay import transactional_id_for
from outbox.services.retention import outbox_event_log_purge

logger = logging.getLogger(__name__)


def worker_slot(*, worker_name: str | None, child_index: int | None) -> str:
    """The relay's slot in a Celery worker: the worker's node name (`-n a@%h`; two workers of
    one host differ by it, so they never share a transactional.id and fence each other) and the
    pool child's index. Both stay the same when the worker restarts, or its pool replaces a
    child (billiard gives the new child the index of the one it replaces), so a restarted
    relay fences its zombie. Outside a worker (a task called directly) the host name stands in
    for the node name."""
    node = worker_name or socket.gethostname()
    return f"{node}-{child_index if child_index is not None else 'main'}"


@shared_task(bind=True, name="outbox.tasks.relay", ignore_result=True)
def relay(self: Task) -> int:
    """Publishes due events, looping while batches come back full."""
    slot = worker_slot(
        worker_name=self.request.hostname,
        child_index=getattr(current_process(), "index", None),
    )
    log_relay = LogRelay(transactional_id=transactional_id_for(slot))
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
