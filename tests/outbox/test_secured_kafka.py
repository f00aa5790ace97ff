"""The relay and the inbox through Kafka's secured listener (scripts/services.sh): TLS with the
project's own CA, a SCRAM-SHA-512 user per role, and ACLs that allow each user only its
topics and group. A topic the relay's user may not write is a permanent error: its key is held
and the other keys flow (issue 42's finding 4 against a real authorizer)."""

import time
import uuid

import pytest
from confluent_kafka.admin import AclOperation, AdminClient, ResourceType
from django.db import transaction

import outbox
from inbox import handler
from inbox.consumer import InboxConsumer
from inbox.models import InboxMessage
from inbox.registry import scoped_registry
from outbox.models import OutboxDelivery, OutboxHeldEvent
from outbox.producer import close_producers
from outbox.services.repairs import outbox_events_retry
from scenarios.secured_kafka import READER, WRITER
from tests.outbox.conftest import consume_all, headers_of, publish_events

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def _connect_as(settings, secured_kafka, user: str) -> None:
    """Points every Kafka client of this process at the secured listener as `user`, as a
    project's KAFKA_EVENTS does (docs/integration.md)."""
    settings.KAFKA_EVENTS = {
        "BOOTSTRAP_SERVERS": secured_kafka.bootstrap,
        "CLIENT_CONFIG": secured_kafka.client_config(user),
    }
    close_producers()


def _wait_until_allowed(secured_kafka, user: str, topic: str, timeout: float = 30.0) -> None:
    """Until the brokers apply a new ACL (KRaft's metadata log): `user` may describe `topic`."""
    admin = AdminClient(
        {"bootstrap.servers": secured_kafka.bootstrap, **secured_kafka.client_config(user)}
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if admin.list_topics(topic, timeout=5).topics[topic].error is None:
            return
        time.sleep(0.2)
    raise AssertionError(f"{user} may still not describe {topic} after {timeout:g} s")


def test_events_go_out_and_come_in_through_tls_scram_and_acls(
    secured_kafka, kafka_topic, kafka_consumer_config, log_relay, settings
):
    topic = kafka_topic(partitions=2)
    group = f"secured-{uuid.uuid4().hex[:8]}"
    relay_user = secured_kafka.user("outbox-relay")
    consumer_user = secured_kafka.user("inbox-consumer")
    secured_kafka.allow(relay_user, ResourceType.TOPIC, topic, *WRITER)
    secured_kafka.allow(consumer_user, ResourceType.TOPIC, topic, *READER)
    secured_kafka.allow(consumer_user, ResourceType.GROUP, group, AclOperation.READ)

    _connect_as(settings, secured_kafka, relay_user)
    relay = log_relay()
    relay.run()
    events = publish_events(topic, 6, keys=3)
    assert relay.run(max_seconds=10).published == 6
    offsets = set(
        OutboxDelivery.objects.filter(outcome="PUBLISHED").values_list(
            "kafka_partition", "kafka_offset"
        )
    )
    assert len(offsets) == 6

    _connect_as(settings, secured_kafka, consumer_user)
    seen: list[str] = []
    with scoped_registry():

        @handler(event_type="OrderPlaced", topic=topic, group=group)
        def apply(message: InboxMessage) -> None:
            seen.append(message.event_id)

        consumer = InboxConsumer(group=group, poll_timeout=0.2)
        consumer.start()
        try:
            for _ in range(300):
                consumer.poll_batch()
                if len(seen) == len(events):
                    break
        finally:
            consumer.close()
    assert sorted(seen) == sorted(str(event.id) for event in events)
    # The records are those the relay wrote: read back over PLAINTEXT, the same offsets.
    messages = consume_all(kafka_consumer_config, topic, expected=6)
    assert {(m.partition(), m.offset()) for m in messages} == offsets


def test_a_topic_the_relay_may_not_write_holds_its_key_and_the_others_flow(
    secured_kafka, kafka_topic, kafka_consumer_config, log_relay, settings
):
    allowed, denied = kafka_topic(), kafka_topic()
    relay_user = secured_kafka.user("outbox-relay")
    secured_kafka.allow(relay_user, ResourceType.TOPIC, allowed, *WRITER)
    _connect_as(settings, secured_kafka, relay_user)
    relay = log_relay()
    relay.run()
    with transaction.atomic():
        refused = outbox.publish(
            aggregate_type="order", aggregate_id="denied", event_type="E", payload={}, topic=denied
        )
    first = relay.run(max_seconds=10)
    flowing = publish_events(allowed, 3, keys=3)
    second = relay.run(max_seconds=10)

    assert (first.published, first.failed) == (0, 1)
    assert second.published == 3
    head = OutboxHeldEvent.objects.get()
    assert (head.event_id, head.attempts) == (refused.id, 1)
    assert "TOPIC_AUTHORIZATION_FAILED" in head.last_error, head.last_error
    messages = consume_all(kafka_consumer_config, allowed, expected=3)
    assert sorted(headers_of(m)["event_id"] for m in messages) == sorted(str(e.id) for e in flowing)

    # Once the user may write the topic, an operator's retry sends the held event.
    secured_kafka.allow(relay_user, ResourceType.TOPIC, denied, *WRITER)
    _wait_until_allowed(secured_kafka, relay_user, denied)
    assert outbox_events_retry(event_ids=[refused.id]) == 1
    assert relay.run(max_seconds=10).published == 1
    assert not OutboxHeldEvent.objects.exists()
    [record] = consume_all(kafka_consumer_config, denied, expected=1)
    assert headers_of(record)["event_id"] == str(refused.id)
