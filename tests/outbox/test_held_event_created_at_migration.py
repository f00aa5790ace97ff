"""Migration 0017: held rows keep their event's created_at, filled from the event rows; a held
row whose event is gone is let go."""

import uuid

import pytest
from django.db import connection, transaction

import outbox
from outbox.models import OutboxHeldEvent
from outbox.selectors import outbox_log_backlog
from outbox.services.event_log.held import held_events_read
from outbox.services.event_log.shards import shard_of
from tests.outbox.test_claim_relay_migration import migrate, outbox_migrated_to

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("outbox", "0016_delivery_discarded_index")
EVENT = {"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "E", "payload": {}}


def hold_as_0016(event_id: uuid.UUID, *, transaction_id: int, position: int) -> None:
    """A held row in the layout of migration 0016: where its event's row is, no time."""
    with connection.cursor() as db:
        db.execute(
            """
            INSERT INTO outbox_held_event (event_id, shard, topic, key, transaction_id,
                                           position, event_transaction_id, event_position,
                                           attempts, next_attempt_at, last_error, held_at)
            VALUES (%s, %s, 'orders', 'o-1', %s, %s, %s, %s, 0, NULL, '', now())
            """,
            [event_id, shard_of("o-1"), transaction_id, position, transaction_id, position],
        )


@pytest.fixture
def schema_0016():
    with outbox_migrated_to(BEFORE):
        yield


def test_held_rows_get_their_events_creation_time_and_orphans_are_let_go(schema_0016):
    with transaction.atomic():
        first = outbox.publish(**EVENT, topic="orders")
        second = outbox.publish(**EVENT, topic="orders")
    for event in (first, second):
        hold_as_0016(event.id, transaction_id=event.transaction_id, position=event.position)
    hold_as_0016(uuid.uuid4(), transaction_id=first.transaction_id, position=10**9)

    migrate()

    held = {row.event_id: row.event_created_at for row in OutboxHeldEvent.objects.all()}
    assert held == {first.id: first.created_at, second.id: second.created_at}
    assert [e.id for e in held_events_read(topic="orders", key="o-1", limit=10)] == [
        first.id,
        second.id,
    ]
    backlog = outbox_log_backlog()
    assert (backlog.held_waiting, backlog.oldest_pending_created_at) == (2, first.created_at)
