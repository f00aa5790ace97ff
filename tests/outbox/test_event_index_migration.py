"""Migration 0013: the event table's indexes cut to three, and the transaction id a NOT NULL
column that orders the console's lists."""

import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

import outbox
from outbox.models import OutboxEvent
from tests.outbox.test_claim_relay_migration import migrate, outbox_migrated_to

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("outbox", "0012_claim_relay_removed")
AFTER = ("outbox", "0013_event_indexes_for_wal")


def event_indexes() -> set[str]:
    with connection.cursor() as db:
        db.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'outbox_event'")
        return {row[0] for row in db.fetchall()}


@pytest.fixture
def schema_before():
    with outbox_migrated_to(BEFORE):
        yield


def test_events_from_before_the_event_log_get_transaction_id_zero_and_list_last(schema_before):
    assert "outbox_event_aggr_idx" in event_indexes()
    old_id = uuid.uuid4()
    with connection.cursor() as db:
        # An event written before migration 0009: no transaction id.
        db.execute(
            """
            INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers,
                                      topic, key, created_at, txid)
            VALUES (%s, 'order', 'o-1', 'E', '{}'::jsonb, '{}'::jsonb, 't', 'o-1', %s, NULL)
            """,
            [old_id, timezone.now()],
        )
    with transaction.atomic():
        new = outbox.publish(aggregate_type="order", aggregate_id="o-1", event_type="E", payload={})

    migrate(AFTER)

    assert event_indexes() == {
        "outbox_event_pkey",
        "outbox_event_txid_idx",
        "outbox_event_key_idx",
        "outbox_event_created_brin",
    }
    assert OutboxEvent.objects.get(pk=old_id).transaction_id == 0
    assert OutboxEvent.objects.get(pk=new.pk).transaction_id == new.transaction_id > 0
    assert list(OutboxEvent.objects.values_list("pk", flat=True)) == [new.pk, old_id]
