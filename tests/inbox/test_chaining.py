"""Chaining: a handler that calls outbox.publish() writes its events in the transaction of
its inbox row, so a consume-then-produce service is exactly-once end to end."""

import signal
import uuid

import pytest

from inbox import handler
from inbox.faults import AFTER_DB_COMMIT, BEFORE_DB_COMMIT
from inbox.models import InboxMessage
from outbox import publish
from outbox.log_relay import LogRelay
from outbox.models import OutboxEvent
from tests.inbox.conftest import consume_until, effect_counts, record_effect, wait_for
from tests.inbox.factories import Event, produce
from tests.inbox.test_consumer import unique_group

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def test_a_chain_of_two_services_applies_each_event_once(
    kafka_topic, inbox_registry, effects, run_consumer
):
    payments, shipments = kafka_topic(), kafka_topic()
    shipping, warehouse = unique_group(), unique_group()

    @handler(event_type="PaymentCompleted", topic=payments, group=shipping)
    def request_shipment(message: InboxMessage) -> None:
        publish(
            aggregate_type="shipment",
            aggregate_id=message.aggregate_id,
            event_type="ShipmentRequested",
            payload={"payment": message.event_id},
            topic=shipments,
        )

    @handler(event_type="ShipmentRequested", topic=shipments, group=warehouse)
    def pick(message: InboxMessage) -> None:
        assert message.payload is not None
        record_effect(group=warehouse, event_id=message.payload["payment"])

    payment = Event(event_type="PaymentCompleted", aggregate_id="order-7")
    produce(payments, [payment, payment])  # delivered twice
    shipper = run_consumer(group=shipping)
    consume_until(
        shipper,
        lambda: InboxMessage.objects.filter(consumer_group=shipping, duplicate_count=1).exists(),
    )
    outgoing = OutboxEvent.objects.get(topic=shipments)
    assert outgoing.payload == {"payment": payment.event_id}
    assert outgoing.key == "order-7"

    relay = LogRelay()
    try:
        assert relay.run().published == 1
    finally:
        relay.close()  # gives up its shards' advisory locks
    picker = run_consumer(group=warehouse)
    consume_until(picker, lambda: effect_counts(warehouse))
    assert effect_counts(warehouse) == {payment.event_id: 1}
    received = InboxMessage.objects.get(consumer_group=warehouse)
    assert received.event_id == str(outgoing.id)
    assert received.aggregate_id == "order-7"


def test_a_failing_handler_publishes_nothing(kafka_topic, inbox_registry, run_consumer):
    payments, shipments, group = kafka_topic(), kafka_topic(), unique_group()

    @handler(event_type="PaymentCompleted", topic=payments, group=group)
    def request_shipment(message: InboxMessage) -> None:
        publish(
            aggregate_type="shipment",
            aggregate_id="1",
            event_type="ShipmentRequested",
            payload={},
            topic=shipments,
        )
        raise RuntimeError("after publishing")

    produce(payments, [Event(event_type="PaymentCompleted")])
    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: InboxMessage.objects.filter(consumer_group=group).exists())
    assert InboxMessage.objects.get(consumer_group=group).attempts == 1
    assert not OutboxEvent.objects.exists()


@pytest.mark.parametrize("fault", [BEFORE_DB_COMMIT, AFTER_DB_COMMIT])
def test_a_crashed_chaining_consumer_publishes_each_event_once(
    consumer_process, kafka_topic, effects, fault
):
    incoming, outgoing = kafka_topic(), kafka_topic()
    group = f"test-chain-{uuid.uuid4().hex[:10]}"
    env = {"INBOX_CONSUMER_CONFIG": f"group.instance.id={group}-member"}
    args = ["--chain-topic", outgoing]
    first, marker = Event(event_type="Effect"), Event(event_type="Effect")
    produce(incoming, [first])

    crashed = consumer_process(
        group=group, topic=incoming, extra_args=args, INBOX_FAULT_INJECT=fault, **env
    )
    assert crashed.wait() == -signal.SIGKILL, crashed.output()
    restarted = consumer_process(group=group, topic=incoming, extra_args=args, **env)
    produce(incoming, [marker])
    wait_for(lambda: marker.event_id in effect_counts(group), what="the marker")
    assert restarted.terminate() == 0, restarted.output()

    published = OutboxEvent.objects.filter(topic=outgoing)
    assert sorted(published.values_list("aggregate_id", flat=True)) == sorted(
        [first.event_id, marker.event_id]
    )
    assert effect_counts(group) == {first.event_id: 1, marker.event_id: 1}
