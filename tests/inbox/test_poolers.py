"""The inbox behind PgBouncer (scripts/services.sh starts it in both pool modes): a consumer
records, deduplicates and applies through either."""

import uuid

import pytest

from inbox import handler
from inbox.models import InboxMessage
from tests.conftest import SESSION_POOL_PORT, TRANSACTION_POOL_PORT, connected_through
from tests.inbox.conftest import consume_until, effect_counts, record_effect
from tests.inbox.factories import make_events, produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("port", [SESSION_POOL_PORT, TRANSACTION_POOL_PORT])
def test_a_consumer_through_a_pool_applies_each_event_once_and_counts_redeliveries(
    port, kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(partitions=2), f"test-pool-{uuid.uuid4().hex[:10]}"

    @handler(event_type="OrderPlaced", topic=topic, group=group)
    def apply(message: InboxMessage) -> None:
        record_effect(group=group, event_id=message.event_id)

    events = make_events(10)
    produce(topic, events)
    produce(topic, events[:3])  # delivered twice
    with connected_through(port):
        consumer = run_consumer(group=group)

        def all_seen() -> bool:
            return (
                InboxMessage.objects.filter(consumer_group=group, duplicate_count=1).count() == 3
                and len(effect_counts(group)) == 10
            )

        consume_until(consumer, all_seen)
        consumer.close()

    assert effect_counts(group) == {event.event_id: 1 for event in events}
    assert (
        InboxMessage.objects.filter(consumer_group=group, status=InboxMessage.Status.DONE).count()
        == 10
    )
