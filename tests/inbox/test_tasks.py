"""inbox/tasks.py: thin wrappers, run eagerly in tests."""

import datetime as dt

import pytest
from django.db import transaction
from django.utils import timezone

from inbox import handler
from inbox.models import InboxMessage
from inbox.services.recording import inbox_message_record_batch
from inbox.tasks import purge_processed, retry_due
from tests.inbox.conftest import records
from tests.inbox.factories import Event

pytestmark = pytest.mark.django_db


def test_retry_due_runs_due_rows(inbox_registry):
    calls = []

    @handler(event_type="OrderPlaced", topic="t", group="tasks")
    def apply(message):
        calls.append(message.event_id)
        if len(calls) == 1:
            raise RuntimeError("first try fails")

    event = Event()
    with transaction.atomic():
        inbox_message_record_batch(group="tasks", records=records([event]))
    InboxMessage.objects.update(next_attempt_at=timezone.now())

    assert retry_due.delay().get() == {"done": 1, "pending": 0, "failed": 0, "skipped": 0}
    assert calls == [event.event_id, event.event_id]


def test_purge_processed_deletes_old_done_rows(inbox_registry):
    handler(event_type="OrderPlaced", topic="t", group="tasks")(lambda message: None)
    with transaction.atomic():
        inbox_message_record_batch(group="tasks", records=records([Event(), Event()]))
    InboxMessage.objects.update(processed_at=timezone.now() - dt.timedelta(days=15))
    assert purge_processed.delay().get() == 2
    assert not InboxMessage.objects.exists()


def test_beat_schedules_both_tasks():
    from django.conf import settings

    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"inbox.tasks.retry_due", "inbox.tasks.purge_processed"} <= tasks
