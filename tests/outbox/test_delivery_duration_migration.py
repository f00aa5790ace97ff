"""Migration 0018: delivery records keep how long each try took; the records written before it
read as of unknown duration, and the migration reverses."""

import uuid

import pytest
from django.db import connection
from django.utils import timezone

from outbox.models import OutboxDelivery
from outbox.services.event_log.deliveries import DeliveryRecord, deliveries_insert
from tests.outbox.test_claim_relay_migration import migrate, outbox_migrated_to

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("outbox", "0017_held_event_created_at")


def tables_with_the_column() -> set[str]:
    """The delivery table and those of its partitions that have a duration_ms column."""
    with connection.cursor() as db:
        db.execute(
            """
            SELECT table_name FROM information_schema.columns
            WHERE column_name = 'duration_ms' AND table_name LIKE %s
            """,
            ["outbox_delivery%"],
        )
        return {row[0] for row in db.fetchall()}


def delivery_tables() -> set[str]:
    with connection.cursor() as db:
        db.execute(
            """
            SELECT 'outbox_delivery' UNION ALL
            SELECT inhrelid::regclass::text FROM pg_inherits
            WHERE inhparent = 'outbox_delivery'::regclass
            """
        )
        return {row[0] for row in db.fetchall()}


def record_as_0017(event_id: uuid.UUID) -> None:
    """A delivery record as the relay of migration 0017 writes it: no duration."""
    with connection.cursor() as db:
        db.execute(
            """
            INSERT INTO outbox_delivery (event_id, outcome, published_at, kafka_partition,
                                         kafka_offset, error, relay)
            VALUES (%s, 'PUBLISHED', now(), 0, 7, '', 'relay-0017')
            """,
            [event_id],
        )


@pytest.fixture
def schema_0017():
    with outbox_migrated_to(BEFORE):
        yield


def test_the_duration_column_is_added_to_every_partition_and_dropped_on_the_way_back(
    schema_0017,
):
    assert tables_with_the_column() == set()
    older = uuid.uuid4()
    record_as_0017(older)

    migrate()

    assert tables_with_the_column() == delivery_tables()
    assert len(delivery_tables()) > 1  # the partitions too, not the parent alone
    newer = uuid.uuid4()
    deliveries_insert(
        relay_id="relay-0018",
        records=[
            DeliveryRecord(
                event_id=newer,
                outcome=OutboxDelivery.Outcome.PUBLISHED,
                published_at=timezone.now(),
                partition=0,
                offset=8,
                duration_ms=12,
            )
        ],
    )
    durations = dict(OutboxDelivery.objects.values_list("event_id", "duration_ms"))
    assert durations == {older: None, newer: 12}  # the older record's is unknown

    migrate(BEFORE)

    assert tables_with_the_column() == set()
    # The records stay, without their durations.
    assert set(OutboxDelivery.objects.values_list("event_id", flat=True)) == {older, newer}
