"""inbox/services/retries.py against PostgreSQL."""

import pytest
from django.utils import timezone

from inbox.models import InboxMessage
from inbox.services.repairs import inbox_message_replay
from inbox.services.retries import inbox_message_retry, inbox_messages_retry_due
from tests.app_settings import override_app_settings
from tests.inbox.conftest import GROUP, effect_counts, record_batch, records
from tests.inbox.factories import Event

pytestmark = pytest.mark.django_db


def test_retries_back_off_until_the_row_fails(applied):
    bad = Event()
    applied["raise_for"] = {bad.event_id}
    with override_app_settings("INBOX", MAX_ATTEMPTS=3):
        record_batch(records([bad]))
        row = InboxMessage.objects.get(event_id=bad.event_id)
        # Not due yet: the retry task leaves it alone.
        assert inbox_messages_retry_due(limit=10)["done"] == 0
        for attempts in (2, 3):
            InboxMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
            inbox_message_retry(message_id=row.pk)
            row.refresh_from_db()
            assert row.attempts == attempts
    assert row.status == InboxMessage.Status.FAILED
    assert row.next_attempt_at is None
    assert effect_counts(GROUP) == {}

    applied["raise_for"] = set()
    inbox_message_replay(message=row)
    assert inbox_messages_retry_due(limit=10) == {
        "done": 1,
        "pending": 0,
        "failed": 0,
        "skipped": 0,
    }
    row.refresh_from_db()
    assert row.status == InboxMessage.Status.DONE
    assert effect_counts(GROUP) == {bad.event_id: 1}


def test_a_retry_without_a_handler_counts_as_a_failed_attempt(applied):
    event = Event(event_type="Gone")
    with override_app_settings("INBOX", UNKNOWN_EVENT_TYPE="fail"):
        record_batch(records([event]))
    row = InboxMessage.objects.get()
    assert row.status == InboxMessage.Status.FAILED
    InboxMessage.objects.filter(pk=row.pk).update(status="PENDING", next_attempt_at=timezone.now())
    inbox_message_retry(message_id=row.pk)
    row.refresh_from_db()
    assert row.attempts == 1
    assert row.last_error.startswith("inbox.errors.NoHandlerForRetry")
