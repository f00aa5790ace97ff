"""Migration 0015: the event table's B-tree on the id gives way to a BRIN index; held rows keep
where their event's row is, ids from before partitioning join the given ids' table."""

import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

import outbox
from outbox.errors import DuplicateEvent
from outbox.models import OutboxEvent, OutboxHeldEvent
from outbox.selectors import outbox_event_delivered, outbox_log_backlog
from outbox.services.event_log.held import held_events_read
from outbox.services.event_log.shards import shard_of
from tests.conftest import event_row_place
from tests.outbox.test_claim_relay_migration import migrate, outbox_migrated_to

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE_PARTITIONS = ("outbox", "0013_event_indexes_for_wal")
BEFORE = ("outbox", "0014_partitioned_event_log")
AFTER = ("outbox", "0015_event_id_brin")
EVENT = {"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "E", "payload": {}}


def event_indexes() -> dict[str, str]:
    with connection.cursor() as db:
        db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'outbox_event'")
        return dict(db.fetchall())


def hold_as_0014(event_id: uuid.UUID, *, transaction_id: int, position: int) -> None:
    """A held row in the layout of migration 0014: its place in its key's order only."""
    with connection.cursor() as db:
        db.execute(
            """
            INSERT INTO outbox_held_event (event_id, shard, topic, key, transaction_id,
                                           position, attempts, next_attempt_at, last_error,
                                           held_at)
            VALUES (%s, %s, 'orders', 'o-1', %s, %s, 0, NULL, '', now())
            """,
            [event_id, shard_of("o-1"), transaction_id, position],
        )


@pytest.fixture
def schema_before_partitions():
    with outbox_migrated_to(BEFORE_PARTITIONS):
        yield


def test_held_rows_keep_their_events_row_and_older_ids_stay_used_once(schema_before_partitions):
    legacy_id = uuid.uuid4()
    with connection.cursor() as db:
        # An event of the table that migration 0014 makes the partition of everything before
        # tomorrow.
        db.execute(
            """
            INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers,
                                      topic, key, created_at)
            VALUES (%s, 'order', 'o-1', 'E', '{}'::jsonb, '{}'::jsonb, 'orders', 'o-1', %s)
            """,
            [legacy_id, timezone.now()],
        )
    migrate(BEFORE)
    assert "outbox_event_id_idx" in event_indexes()
    with transaction.atomic():
        waiting = outbox.publish(**EVENT, topic="orders")
        replayed = outbox.publish(**EVENT, topic="orders")
    # `waiting` is held at its own place; `replayed` at a place after it, as a replay of it
    # with its own id is; the third row's event is gone.
    hold_as_0014(waiting.id, transaction_id=waiting.transaction_id, position=waiting.position)
    hold_as_0014(replayed.id, transaction_id=waiting.transaction_id + 1, position=10**9)
    hold_as_0014(uuid.uuid4(), transaction_id=waiting.transaction_id, position=10**9 + 1)

    migrate(AFTER)

    indexes = event_indexes()
    assert "outbox_event_id_idx" not in indexes
    assert "USING brin (id uuid_minmax_multi_ops)" in indexes["outbox_event_id_brin"]
    # The current code reads held rows with their event's created_at (migration 0017, which
    # fills it from the place 0015 filled).
    migrate()
    held = {row.event_id: row for row in OutboxHeldEvent.objects.all()}
    assert set(held) == {waiting.id, replayed.id}, "the row whose event is gone is let go"
    for event in (waiting, replayed):
        row = held[event.id]
        assert event_row_place(event) == {
            "event_transaction_id": row.event_transaction_id,
            "event_position": row.event_position,
            "event_created_at": row.event_created_at,
        }
    assert held[replayed.id].position == 10**9, "its place in the key's order is kept"
    # Read through the relay's index of commit order: both held events, in their order.
    assert [e.id for e in held_events_read(topic="orders", key="o-1", limit=10)] == [
        waiting.id,
        replayed.id,
    ]
    assert outbox_log_backlog().held_waiting == 2
    assert outbox_event_delivered(event_id=legacy_id).delivery_status == "PENDING"
    with transaction.atomic(), pytest.raises(DuplicateEvent):
        outbox.publish(**EVENT, event_id=legacy_id)

    migrate(BEFORE)

    assert "outbox_event_id_idx" in event_indexes()
    assert "outbox_event_id_brin" not in event_indexes()
    with connection.cursor() as db:
        db.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'outbox_held_event' AND column_name LIKE 'event\\_%%'"
        )
        assert db.fetchone()[0] == 1, "event_id only"
    migrate()
    assert OutboxEvent.objects.filter(pk=legacy_id).exists()
