"""Operators' repairs with the event-log relay: retry, discard, release and replay act on the
held set and the delivery records, and the relay sends what they let go, in order per key."""

import uuid

import pytest
from django.db import transaction
from django.utils import timezone

import outbox
from outbox.errors import IllegalTransition
from outbox.log_relay import LogRelay
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.producer import close_producers
from outbox.selectors import outbox_event_delivered, outbox_quarantined_keys
from outbox.services.repairs import (
    REPLAY_OF_HEADER,
    outbox_event_discard,
    outbox_event_replay,
    outbox_event_retry,
    outbox_events_discard,
    outbox_events_retry,
    outbox_key_release,
)
from tests.conftest import publish_numbered
from tests.outbox.conftest import consume_all, headers_of, payload_of

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def spend_attempts(relay: LogRelay) -> None:
    """Runs the relay until every failed head has used its attempts (OUTBOX_MAX_ATTEMPTS=2)."""
    relay.run()
    OutboxHeldEvent.objects.filter(attempts__gt=0).update(next_attempt_at=timezone.now())
    relay.run()
    assert not OutboxHeldEvent.objects.filter(next_attempt_at__isnull=False).exists()


def lift_size_limit(settings) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {}}
    close_producers()


def seqs_by_key(messages) -> dict[str, list[int]]:
    by_key: dict[str, list[int]] = {}
    for message in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        by_key.setdefault((message.key() or b"").decode(), []).append(payload_of(message)["seq"])
    return by_key


def status(event: OutboxEvent) -> tuple[str, bool]:
    current = outbox_event_delivered(event_id=event.id)
    return current.delivery_status, current.delivery_discarded_at is not None


def test_retry_sends_a_spent_head_then_its_key_and_discard_lets_the_key_go_on(
    kafka_topic, kafka_consumer_config, size_limited_log_relay, settings
):
    topic = kafka_topic()
    a0 = publish_numbered(topic, "a", 0, too_large=True)
    a1, a2 = publish_numbered(topic, "a", 1), publish_numbered(topic, "a", 2)
    b0 = publish_numbered(topic, "b", 0, too_large=True)
    b1 = publish_numbered(topic, "b", 1)
    spend_attempts(size_limited_log_relay)

    assert [status(e) for e in (a0, a1, a2, b0, b1)] == [
        ("FAILED", False),
        ("PENDING", False),
        ("PENDING", False),
        ("FAILED", False),
        ("PENDING", False),
    ]
    failed = outbox_event_delivered(event_id=a0.id)
    assert failed.delivery_attempts == 2
    assert "MSG_SIZE_TOO_LARGE" in failed.delivery_error
    with pytest.raises(IllegalTransition, match=f"waits behind event {a0.id}"):
        outbox_event_retry(event=a1)
    with pytest.raises(IllegalTransition, match="Only FAILED events can be discarded"):
        outbox_event_discard(event=a1)

    assert {(k.key, k.blocking_event_id) for k in outbox_quarantined_keys()} == {
        ("a", str(a0.id)),
        ("b", str(b0.id)),
    }
    discarded = outbox_event_discard(event=a0)
    # a's next event heads its key now, due at once: the relay's next run sends it.
    assert {(k.key, k.blocking_event_id, k.blocking_status) for k in outbox_quarantined_keys()} == {
        ("a", str(a1.id), "PENDING"),
        ("b", str(b0.id), "FAILED"),
    }
    assert (discarded.delivery_status, discarded.delivery_discarded_at is not None) == (
        "FAILED",
        True,
    )
    assert (
        size_limited_log_relay.run().published == 2
    )  # a1, a2: a0's attempts are spent, it is let go
    assert status(b1) == ("PENDING", False)  # b waits behind its own head
    lift_size_limit(settings)
    retried = outbox_event_retry(event=b0)
    assert retried.delivery_status == "PENDING"
    assert size_limited_log_relay.run().published == 2

    assert [status(e) for e in (a0, a1, a2, b0, b1)] == [
        ("FAILED", True),
        ("DONE", False),
        ("DONE", False),
        ("DONE", False),
        ("DONE", False),
    ]
    assert seqs_by_key(consume_all(kafka_consumer_config, topic, expected=4)) == {
        "a": [1, 2],
        "b": [0, 1],
    }
    assert list(
        OutboxDelivery.objects.filter(event_id=a0.id).order_by("id").values_list("outcome")
    ) == [("FAILED",), ("FAILED",), ("DISCARDED",)]
    with pytest.raises(IllegalTransition, match="already published"):
        outbox_event_retry(event=b0)
    with pytest.raises(IllegalTransition, match="was discarded"):
        outbox_event_retry(event=a0)
    with pytest.raises(IllegalTransition, match="Only FAILED events can be discarded"):
        outbox_event_discard(event=b0)
    assert not OutboxHeldEvent.objects.exists()
    assert outbox_quarantined_keys() == []


def test_bulk_retry_and_discard_change_only_the_events_they_may(
    kafka_topic, size_limited_log_relay
):
    topic = kafka_topic()
    heads = [publish_numbered(topic, key, 0, too_large=True) for key in ("a", "b", "c")]
    waiting = publish_numbered(topic, "a", 1)
    spend_attempts(size_limited_log_relay)
    unknown = uuid.uuid4()

    assert outbox_events_discard(event_ids=[heads[0].id, waiting.id, unknown]) == 1
    assert outbox_events_retry(event_ids=[heads[1].id, waiting.id, heads[0].id, unknown]) == 1

    assert [status(e) for e in heads] == [("FAILED", True), ("PENDING", False), ("FAILED", False)]
    assert OutboxHeldEvent.objects.get(event_id=heads[1].id).attempts == 0


def test_release_discards_a_spent_head_and_makes_a_backing_off_one_due(
    kafka_topic, kafka_consumer_config, size_limited_log_relay, settings
):
    topic = kafka_topic()
    spent = publish_numbered(topic, "spent", 0, too_large=True)
    publish_numbered(topic, "spent", 1)
    spend_attempts(size_limited_log_relay)
    backing_off = publish_numbered(topic, "backing-off", 0, too_large=True)
    publish_numbered(topic, "backing-off", 1)
    size_limited_log_relay.run()
    assert OutboxHeldEvent.objects.get(event_id=backing_off.id).next_attempt_at > timezone.now()

    assert outbox_key_release(topic=topic, key="spent") == 1
    assert outbox_key_release(topic=topic, key="backing-off") == 1
    lift_size_limit(settings)
    size_limited_log_relay.run()

    assert status(spent) == ("FAILED", True)
    assert status(backing_off) == ("DONE", False)
    assert seqs_by_key(consume_all(kafka_consumer_config, topic, expected=3)) == {
        "spent": [1],
        "backing-off": [0, 1],
    }
    assert outbox_key_release(topic=topic, key="spent") == 0


def test_replay_sends_a_published_event_again_after_its_key_and_a_discarded_one_with_a_new_id(
    kafka_topic, kafka_consumer_config, size_limited_log_relay, settings
):
    topic = kafka_topic()
    discarded = publish_numbered(topic, "d", 0, too_large=True)
    spend_attempts(size_limited_log_relay)
    outbox_event_discard(event=discarded)
    lift_size_limit(settings)
    first = publish_numbered(topic, "k", 0)
    size_limited_log_relay.run()
    with pytest.raises(IllegalTransition, match="Only published or discarded"):
        outbox_event_replay(event=publish_numbered(topic, "k", 1), new_event_id=False)

    replayed = outbox_event_replay(event=first, new_event_id=False)
    assert replayed.delivery_status == "PENDING"
    with pytest.raises(IllegalTransition, match="Only published or discarded"):
        outbox_event_replay(event=first, new_event_id=False)  # queued already
    copy = outbox_event_replay(event=discarded, new_event_id=True)
    size_limited_log_relay.run()

    messages = consume_all(kafka_consumer_config, topic, expected=4)
    assert seqs_by_key(messages) == {"k": [0, 1, 0], "d": [0]}
    assert [headers_of(m)["event_id"] for m in messages if m.key() == b"k"].count(
        str(first.id)
    ) == 2
    again = outbox_event_delivered(event_id=first.id)
    assert again.delivery_status == "DONE"
    copies = [m for m in messages if headers_of(m)["event_id"] == str(first.id)]
    assert again.delivered_offset == copies[-1].offset()  # the replayed copy's
    assert status(copy) == ("DONE", False)
    assert headers_of(next(m for m in messages if m.key() == b"d"))["replay_of"] == str(
        discarded.id
    )


def test_replay_with_a_new_id_publishes_a_copy_naming_the_original(kafka_topic, log_relay):
    topic = kafka_topic()
    with transaction.atomic():
        original = outbox.publish(
            aggregate_type="order",
            aggregate_id="A",
            event_type="E",
            payload={"n": 1},
            topic=topic,
            headers={"tenant": "eu"},
        )
    assert log_relay().run().published == 1

    copy = outbox_event_replay(event=original, new_event_id=True)

    assert copy.id != original.id
    assert copy.headers == {"tenant": "eu", REPLAY_OF_HEADER: str(original.id)}
    assert (copy.payload, copy.topic, copy.key) == (original.payload, original.topic, original.key)
    assert outbox_event_delivered(event_id=copy.id).delivery_status == "PENDING"
