"""inbox/consumer.py: two consumer processes in one group, with rebalances mid-stream."""

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from inbox.models import InboxMessage
from kafka_events.kafka import kafka_connection_config
from tests.inbox.conftest import effect_counts, effect_workers, wait_for
from tests.inbox.factories import make_events, produce
from tests.inbox.test_consumer import committed_offsets

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def group_type(group: str) -> str:
    """ "classic" or "consumer", as the group coordinator describes the group."""
    admin = AdminClient(kafka_connection_config())
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return str(description.type.name).lower()


EVENTS = 600
PARTITIONS = 6


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_two_consumers_with_rebalances_process_every_event_exactly_once(
    consumer_process, kafka_topic, effects, protocol
):
    topic, group = kafka_topic(partitions=PARTITIONS), f"test-group-{uuid.uuid4().hex[:10]}"
    events = make_events(EVENTS, event_type="Effect")
    produce(topic, events)  # keyed by aggregate id: spread over the 6 partitions
    # Small batches of slowish handlers, so that both rebalances land mid-stream; the group
    # protocol, classic or consumer (KIP-848: the broker assigns, incrementally).
    slow = {
        "INBOX_BATCH_SIZE": "10",
        "INBOX_GROUP_PROTOCOL": protocol,
        "extra_args": ["--handler-sleep", "0.025"],
    }

    first = consumer_process(group=group, topic=topic, **slow)
    wait_for(lambda: len(effect_counts(group)) >= 100, what="the first consumer to start")
    # A second member joins: the group rebalances and the first gives up some partitions.
    second = consumer_process(group=group, topic=topic, **slow)
    wait_for(lambda: len(effect_workers(group)) == 2, what="the second consumer to take part")
    assert group_type(group) == protocol  # the broker runs the group with that protocol
    # The first leaves (SIGTERM): it finishes its batch, commits, and its partitions move over.
    assert len(effect_counts(group)) < EVENTS, "the run ended before the rebalances"
    assert first.terminate() == 0, first.output()

    wait_for(lambda: len(effect_counts(group)) == EVENTS, what="every event", timeout=120)
    assert second.terminate() == 0, second.output()

    counts = effect_counts(group)
    assert set(counts) == {e.event_id for e in events}
    assert set(counts.values()) == {1}, "an event was applied twice"
    assert InboxMessage.objects.filter(consumer_group=group, status="DONE").count() == EVENTS
    assert sum(committed_offsets(group, topic, PARTITIONS)) == EVENTS


def test_a_fenced_static_member_rejoins_with_a_new_consumer(consumer_process, kafka_topic, effects):
    # Two processes with one group.instance.id: the second fences the first, whose librdkafka
    # consumer is then dead for good (a fatal error). It must replace itself, not idle.
    topic, group = kafka_topic(partitions=3), f"test-group-{uuid.uuid4().hex[:10]}"
    static = {
        "INBOX_CONSUMER_CONFIG": (
            f"group.instance.id={group}-1,session.timeout.ms=10000,heartbeat.interval.ms=500"
        )
    }
    before = make_events(100, event_type="Effect")
    produce(topic, before)
    first = consumer_process(group=group, topic=topic, **static)
    wait_for(lambda: len(effect_counts(group)) == 100, what="the first consumer", timeout=60)

    impostor = consumer_process(group=group, topic=topic, **static)
    wait_for(lambda: "Inbox consumer for group" in impostor.output(), what="the impostor")
    time.sleep(5)  # it joins, and the first's next heartbeats are refused: fenced
    impostor.popen.kill()  # gone without leaving the group: its slot is taken over
    impostor.popen.wait()

    after = make_events(100, event_type="Effect")
    produce(topic, after)
    wait_for(lambda: len(effect_counts(group)) == 200, what="every event", timeout=120)
    assert first.terminate() == 0, first.output()
    assert "fatal consumer error" in first.output()
    counts = effect_counts(group)
    assert set(counts) == {e.event_id for e in before + after}
    assert set(counts.values()) == {1}, "an event was applied twice"
