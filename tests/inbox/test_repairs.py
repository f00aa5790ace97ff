"""inbox/services/repairs.py against PostgreSQL."""

import pytest
from confluent_kafka import Message

from inbox.errors import InvalidTransition
from inbox.models import InboxMessage
from inbox.records import parse_record
from inbox.services.repairs import inbox_message_discard, inbox_message_replay
from inbox.services.retries import inbox_messages_retry_due
from tests.app_settings import override_app_settings
from tests.inbox.conftest import GROUP, effect_counts, record_batch, records
from tests.inbox.factories import Event

pytestmark = pytest.mark.django_db


def test_only_failed_rows_with_json_can_be_replayed(applied):
    record_batch(records([Event()]))
    done = InboxMessage.objects.get()
    with pytest.raises(InvalidTransition, match="Only FAILED"):
        inbox_message_replay(message=done)
    not_json = Message(topic="t", partition=0, offset=9, value=b"zz", headers=[("event_id", b"e9")])
    record_batch([parse_record(not_json)])
    with pytest.raises(InvalidTransition, match="not JSON"):
        inbox_message_replay(message=InboxMessage.objects.get(offset=9))


def test_a_discarded_row_stays_a_dedup_record_until_replayed(applied):
    bad = Event()
    applied["raise_for"] = {bad.event_id}
    with override_app_settings("INBOX", MAX_ATTEMPTS=1):
        record_batch(records([bad]))
    row = InboxMessage.objects.get(event_id=bad.event_id)
    assert row.status == InboxMessage.Status.FAILED
    inbox_message_discard(message=row)
    with pytest.raises(InvalidTransition, match="already discarded"):
        inbox_message_discard(message=row)

    applied["raise_for"] = set()
    record_batch(records([bad], start=5))  # redelivered: counted, not run
    row.refresh_from_db()
    assert (row.status, row.duplicate_count) == (InboxMessage.Status.FAILED, 1)
    assert row.discarded_at is not None
    assert effect_counts(GROUP) == {}

    inbox_message_replay(message=row)
    assert inbox_messages_retry_due(limit=10)["done"] == 1
    row.refresh_from_db()
    assert (row.status, row.discarded_at) == (InboxMessage.Status.DONE, None)
    assert effect_counts(GROUP) == {bad.event_id: 1}
