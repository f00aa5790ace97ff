"""inbox/selectors.py"""

import datetime as dt

import pytest
from django.utils import timezone

from inbox.models import ConsumerOffset, InboxMessage
from inbox.selectors import (
    consumer_offsets_for,
    inbox_message_counts_by_status,
    inbox_message_ids_due_for_retry,
)

pytestmark = pytest.mark.django_db


def make_message(event_id, **fields):
    return InboxMessage.objects.create(
        event_id=event_id, consumer_group="g", topic="t", partition=0, offset=0, **fields
    )


def test_due_rows_come_oldest_due_first_and_only_pending():
    now = timezone.now()
    later = make_message("a", next_attempt_at=now - dt.timedelta(seconds=1))
    first = make_message("b", next_attempt_at=now - dt.timedelta(seconds=10))
    make_message("c", next_attempt_at=now + dt.timedelta(minutes=5))
    make_message("d", next_attempt_at=now - dt.timedelta(seconds=20), status="FAILED")
    assert inbox_message_ids_due_for_retry(limit=10) == [first.pk, later.pk]
    assert inbox_message_ids_due_for_retry(limit=1) == [first.pk]


def test_counts_by_status():
    make_message("a", status="DONE")
    make_message("b", status="DONE")
    make_message("c", status="FAILED")
    assert inbox_message_counts_by_status(consumer_group="g") == {"DONE": 2, "FAILED": 1}


def test_consumer_offsets_for_the_assigned_partitions_only():
    ConsumerOffset.objects.create(consumer_group="g", topic="t", partition=0, next_offset=5)
    ConsumerOffset.objects.create(consumer_group="g", topic="t", partition=1, next_offset=7)
    ConsumerOffset.objects.create(consumer_group="other", topic="t", partition=0, next_offset=9)
    assert consumer_offsets_for(group="g", partitions=[("t", 0), ("t", 2)]) == {("t", 0): 5}
