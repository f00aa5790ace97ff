"""inbox/services/retention.py against PostgreSQL."""

import datetime as dt

import pytest
from django.utils import timezone

from inbox.models import InboxMessage
from inbox.services.retention import inbox_messages_purge_processed
from tests.app_settings import override_app_settings
from tests.inbox.conftest import record_batch, records
from tests.inbox.factories import Event

pytestmark = pytest.mark.django_db


def test_purge_deletes_old_done_rows_in_bounded_batches(applied):
    record_batch(records([Event() for _ in range(5)]))
    old = timezone.now() - dt.timedelta(days=30)
    InboxMessage.objects.update(processed_at=old)
    failed = InboxMessage.objects.first()
    assert failed is not None
    InboxMessage.objects.filter(pk=failed.pk).update(status="FAILED")

    assert inbox_messages_purge_processed(batch_size=2, max_batches=1) == 2
    assert InboxMessage.objects.count() == 3
    assert inbox_messages_purge_processed(batch_size=2, max_batches=10) == 2
    # FAILED rows wait for an operator, whatever their age.
    assert list(InboxMessage.objects.values_list("status", flat=True)) == ["FAILED"]


def test_purge_keeps_rows_younger_than_the_retention(applied):
    record_batch(records([Event()]))
    with override_app_settings("INBOX", RETENTION_DAYS=14):
        assert inbox_messages_purge_processed() == 0
    assert InboxMessage.objects.count() == 1
