import json
import re
import signal
import uuid
from collections import Counter, defaultdict
from datetime import UTC, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import outbox
from outbox.models import OutboxEvent
from outbox.producer import close_producers, get_producer
from outbox.relay import Relay, transactional_id_for
from outbox.selectors import outbox_quarantined_keys
from outbox.services.claims import outbox_events_claim
from outbox.services.repairs import outbox_event_retry
from outbox.services.retention import outbox_events_purge_published
from tests.outbox.conftest import (
    consume_all,
    headers_of,
    payload_of,
    publish_events,
    wait_until,
)

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("claim_relay"),
]


def assert_order_per_key(messages) -> None:
    by_key = defaultdict(list)
    for message in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        by_key[message.key()].append(payload_of(message)["seq"])
    for key, sequence in by_key.items():
        assert sequence == sorted(sequence), f"order broken for key {key!r}: {sequence}"


def test_committed_events_reach_the_topic_exactly_as_recorded(kafka_topic, kafka_consumer_config):
    topic = kafka_topic(partitions=3)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with transaction.atomic():
        events = [
            outbox.publish(
                aggregate_type="payment",
                aggregate_id=f"p-{number % 4}",
                event_type="PaymentCompleted",
                payload={"seq": number // 4, "amount": "9.99", "note": "é"},
                topic=topic,
                headers={"traceparent": traceparent},
            )
            for number in range(20)
        ]
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.publish(
            aggregate_type="payment", aggregate_id="x", event_type="E", payload={}, topic=topic
        )
        raise RuntimeError("rolled back")

    result = Relay().run()
    assert result.published == 20

    messages = consume_all(kafka_consumer_config, topic, expected=20)
    assert len(messages) == 20
    by_id = {headers_of(m)["event_id"]: m for m in messages}
    assert set(by_id) == {str(event.id) for event in events}
    for event in events:
        stored = OutboxEvent.objects.get(pk=event.pk)
        message = by_id[str(event.id)]
        assert stored.status == OutboxEvent.Status.DONE
        assert (stored.kafka_partition, stored.kafka_offset) == (
            message.partition(),
            message.offset(),
        )
        assert stored.published_at >= stored.created_at
        assert stored.attempts == 1
        assert message.key() == event.key.encode()
        assert json.loads(message.value().decode("utf-8")) == event.payload
        headers = headers_of(message)
        assert headers == {
            "event_id": str(event.id),
            "event_type": "PaymentCompleted",
            "aggregate_type": "payment",
            "aggregate_id": event.aggregate_id,
            "created_at": stored.created_at.astimezone(UTC).isoformat(),
            "content-type": "application/json",
            "traceparent": traceparent,
        }
    assert_order_per_key(messages)


def test_with_the_broker_unreachable_events_stay_pending_and_go_out_once_it_is_back(
    kafka_topic, kafka_consumer_config, settings
):
    topic = kafka_topic()
    events = publish_events(topic, 5, keys=5)
    real_servers = settings.KAFKA_BOOTSTRAP_SERVERS
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:1"  # nothing listens there
    settings.OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS = 1500
    settings.OUTBOX_RETRY_BASE_SECONDS = 0.5
    before = timezone.now()

    result = Relay().run_once()

    assert result.failed == 5
    for event in OutboxEvent.objects.filter(pk__in=[e.pk for e in events]):
        assert event.status == OutboxEvent.Status.PENDING
        assert event.attempts == 1
        assert "_MSG_TIMED_OUT" in event.last_error
        # Equal jitter: between half and all of base * 2**0 seconds from now.
        assert before + timedelta(seconds=0.25) <= event.next_attempt_at
        assert event.next_attempt_at <= timezone.now() + timedelta(seconds=0.5)
        assert event.locked_by == ""
    assert Relay().run_once().claimed == 0  # not before the backoff has passed

    settings.KAFKA_BOOTSTRAP_SERVERS = real_servers
    # The default delivery timeout again: a 1.5 s one can run out while a loaded machine makes
    # the new producer's first connection, and each such attempt counts.
    settings.OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS = 30_000
    close_producers()
    wait_until(lambda: Relay().run().published == 5, timeout=30, message="the retry")
    assert set(OutboxEvent.objects.values_list("status", "attempts")) == {("DONE", 2)}
    messages = consume_all(kafka_consumer_config, topic, expected=5)
    assert Counter(headers_of(m)["event_id"] for m in messages) == {str(e.id): 1 for e in events}


def test_after_the_last_attempt_an_event_is_failed_until_an_operator_retries_it(settings):
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:1"
    settings.OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS = 1000
    settings.OUTBOX_MAX_ATTEMPTS = 2
    (event,) = publish_events("never.delivered", 1)
    Relay().run_once()
    OutboxEvent.objects.update(next_attempt_at=timezone.now())
    Relay().run_once()
    event.refresh_from_db()
    assert (event.status, event.attempts) == (OutboxEvent.Status.FAILED, 2)
    OutboxEvent.objects.update(next_attempt_at=timezone.now())
    assert Relay().run_once().claimed == 0  # FAILED waits for an operator

    outbox_event_retry(event=event)
    event.refresh_from_db()
    assert (event.status, event.attempts) == (OutboxEvent.Status.PENDING, 0)


def test_order_per_key_holds_while_one_key_is_quarantined(
    kafka_topic, kafka_consumer_config, settings
):
    topic = kafka_topic(partitions=2)
    # Records over this size are refused by the producer: the first event of key A fails.
    settings.OUTBOX_PRODUCER_CONFIG = {"message.max.bytes": "4000"}
    with transaction.atomic():
        a1 = outbox.publish(
            aggregate_type="order",
            aggregate_id="A",
            event_type="E",
            topic=topic,
            payload={"seq": 0, "blob": "x" * 5000},
        )
        a_rest = [
            outbox.publish(
                aggregate_type="order",
                aggregate_id="A",
                event_type="E",
                topic=topic,
                payload={"seq": seq},
            )
            for seq in (1, 2)
        ]
        b_all = [
            outbox.publish(
                aggregate_type="order",
                aggregate_id="B",
                event_type="E",
                topic=topic,
                payload={"seq": seq},
            )
            for seq in range(3)
        ]

    Relay().run()

    a1.refresh_from_db()
    assert a1.status == OutboxEvent.Status.PENDING
    assert a1.attempts == 1
    assert "MSG_SIZE_TOO_LARGE" in a1.last_error
    assert (
        not OutboxEvent.objects.filter(pk__in=[e.pk for e in a_rest])
        .exclude(status="PENDING")
        .exists()
    )
    assert not OutboxEvent.objects.filter(pk__in=[e.pk for e in a_rest], attempts__gt=0).exists()
    assert set(
        OutboxEvent.objects.filter(pk__in=[e.pk for e in b_all]).values_list("status", flat=True)
    ) == {"DONE"}
    (quarantined,) = outbox_quarantined_keys()
    assert (quarantined.topic, quarantined.key) == (topic, "A")
    assert quarantined.blocking_event_id == str(a1.id)
    assert quarantined.waiting_events == 2

    # The operator raises the limit and retries the blocking event: the key flows, in order.
    settings.OUTBOX_PRODUCER_CONFIG = {}
    close_producers()
    outbox_event_retry(event=a1)
    Relay().run()
    assert set(OutboxEvent.objects.values_list("status", flat=True)) == {"DONE"}
    assert outbox_quarantined_keys() == []
    messages = consume_all(kafka_consumer_config, topic, expected=6)
    assert len(messages) == 6
    assert_order_per_key(messages)
    a_offsets = [OutboxEvent.objects.get(pk=event.pk).kafka_offset for event in (a1, *a_rest)]
    assert a_offsets == sorted(a_offsets)


def test_two_relays_racing_over_5000_events_publish_each_once(
    kafka_topic, kafka_consumer_config, start_relay
):
    topic = kafka_topic(partitions=6)
    relays = [start_relay("--batch-size", "500"), start_relay("--batch-size", "500")]
    for relay in relays:  # both ready before the first event, so that they race for it
        assert relay.stdout is not None
        assert "listening" in relay.stdout.readline()
    events = []
    for start in range(0, 5000, 1000):
        events += publish_events(topic, 1000, keys=1000, start=start)

    wait_until(
        lambda: not OutboxEvent.objects.exclude(status="DONE").exists(),
        timeout=240,
        message="every event DONE",
    )
    published_by_relay = []
    for relay in relays:
        relay.send_signal(signal.SIGTERM)
        output, _ = relay.communicate(timeout=30)
        assert relay.returncode == 0, output
        published_by_relay.append(int(re.search(r"after publishing (\d+) events", output)[1]))
    messages = consume_all(kafka_consumer_config, topic, expected=5000)
    counts = Counter(headers_of(m)["event_id"] for m in messages)
    assert len(counts) == 5000
    assert max(counts.values()) == 1, "an event was published twice"
    assert_order_per_key(messages)
    # Both relays took part, so the race was real, and together they published each once.
    assert all(published_by_relay), published_by_relay
    assert sum(published_by_relay) == 5000


def test_a_relay_killed_mid_batch_loses_nothing(kafka_topic, kafka_consumer_config, start_relay):
    topic = kafka_topic(partitions=3)
    events = publish_events(topic, 300, keys=50)

    short_lease = {"OUTBOX_LEASE_SECONDS": "8", "OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS": "2000"}
    doomed = start_relay(OUTBOX_FAULT_INJECTION="before-mark", **short_lease)
    assert doomed.wait(60) == -signal.SIGKILL
    # It produced a batch and died before marking it: the rows are PENDING, still leased.
    assert OutboxEvent.objects.filter(status="PENDING").exclude(locked_by="").exists()
    assert not OutboxEvent.objects.filter(status="DONE").exists()

    survivor = start_relay(**short_lease)
    wait_until(
        lambda: not OutboxEvent.objects.exclude(status="DONE").exists(),
        timeout=60,
        message="the survivor to finish after the lease expired",
    )
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(30) == 0
    messages = consume_all(kafka_consumer_config, topic, expected=300)
    counts = Counter(headers_of(m)["event_id"] for m in messages)
    assert set(counts) == {str(e.id) for e in events}, "an event was lost"
    # The killed relay's batch may be in the log twice (at-least-once); consumers dedup it.
    assert_order_per_key([m for m in messages if counts[headers_of(m)["event_id"]] == 1])


def test_the_long_running_relay_wakes_on_commit_and_stops_cleanly(kafka_topic, start_relay):
    topic = kafka_topic()
    relay = start_relay("--poll-seconds", "30")  # only a notification can wake it in time
    assert relay.stdout is not None
    assert "listening" in relay.stdout.readline()
    publish_events(topic, 3)
    wait_until(lambda: OutboxEvent.objects.filter(status="DONE").count() == 3, timeout=10)
    relay.send_signal(signal.SIGTERM)
    assert relay.wait(40) == 0


def test_a_run_says_whether_it_drained_or_stopped_at_its_deadline(kafka_topic):
    # outbox_relay waits for a notification only after a drained run; after a run stopped at
    # its deadline it goes on at once, or a backlog would drain at half speed.
    publish_events(kafka_topic(), 3, keys=3)
    relay = Relay(batch_size=1)
    stopped = relay.run(max_seconds=1e-6)
    assert (stopped.published, stopped.drained) == (1, False)
    rest = relay.run()
    assert (rest.published, rest.drained) == (2, True)


def test_retention_deletes_only_old_published_events_in_batches():
    publish_events("retention.topic", 7, keys=7)
    old = timezone.now() - timedelta(days=8)
    ids = list(OutboxEvent.objects.order_by("position").values_list("pk", flat=True))
    OutboxEvent.objects.filter(pk__in=ids[:5]).update(status="DONE", published_at=old)
    OutboxEvent.objects.filter(pk=ids[5]).update(status="DONE", published_at=timezone.now())

    deleted = outbox_events_purge_published(
        older_than=timezone.now() - timedelta(days=7), batch_size=2
    )

    assert deleted == 5
    assert set(OutboxEvent.objects.values_list("pk", flat=True)) == set(ids[5:])


class MarksBeforeProducing(Relay):
    """A deliberately broken relay: marks its batch DONE first, then dies before producing."""

    def run_once(self):
        from outbox.services.claims import (
            Delivery,
            outbox_events_claim,
            outbox_events_mark_published,
        )

        events = outbox_events_claim(relay_id=self.relay_id, batch_size=self.batch_size)
        outbox_events_mark_published(
            deliveries=[
                Delivery(event_id=e.id, partition=0, offset=0, published_at=timezone.now())
                for e in events
            ]
        )
        raise SystemExit("killed between the mark and the produce")


def test_the_loss_check_catches_a_relay_that_marks_before_the_delivery_report(
    kafka_topic, kafka_consumer_config
):
    # The check of test_a_relay_killed_mid_batch_loses_nothing, against a broken relay.
    topic = kafka_topic()
    events = publish_events(topic, 20, keys=20)
    with pytest.raises(SystemExit):
        MarksBeforeProducing(batch_size=5).run_once()
    Relay().run()
    assert not OutboxEvent.objects.exclude(status="DONE").exists()
    messages = consume_all(kafka_consumer_config, topic, expected=20, timeout=10)
    lost = {str(e.id) for e in events} - {headers_of(m)["event_id"] for m in messages}
    assert len(lost) == 5


def test_transactional_mode_fences_a_zombie_relay(
    kafka_topic, kafka_consumer_config, start_relay, settings
):
    settings.OUTBOX_RELAY_TRANSACTIONAL = True
    slot = f"fence-{uuid.uuid4().hex[:8]}"
    zombie = Relay(transactional_id=transactional_id_for(slot))
    topic = kafka_topic(partitions=2)
    first = publish_events(topic, 10, keys=10)
    assert zombie.run().published == 10

    # The zombie claims a second batch, then stalls; a successor takes over its slot.
    second = publish_events(topic, 10, keys=10, start=10)
    claimed = outbox_events_claim(relay_id=zombie.relay_id, batch_size=100)
    assert len(claimed) == 10
    successor = start_relay("--slot", slot, OUTBOX_RELAY_TRANSACTIONAL="true")
    assert successor.stdout is not None
    assert "listening" in successor.stdout.readline()

    # The zombie wakes up and publishes: its transaction is fenced, nothing becomes visible,
    # and its rows go back to PENDING without a penalty.
    producer = get_producer(transactional_id=zombie.transactional_id)
    reports, fatal = zombie._publish_in_transaction(producer, claimed)
    assert fatal
    assert "FENCED" in producer.fatal_error.name() or "EPOCH" in producer.fatal_error.name()
    result = zombie._mark(claimed, reports, fatal)
    assert result.released == 10
    assert set(
        OutboxEvent.objects.filter(pk__in=[e.pk for e in second]).values_list("attempts", flat=True)
    ) == {0}

    wait_until(
        lambda: not OutboxEvent.objects.exclude(status="DONE").exists(),
        timeout=60,
        message="the successor to publish the zombie's batch",
    )
    successor.send_signal(signal.SIGTERM)
    assert successor.wait(30) == 0
    messages = consume_all(kafka_consumer_config, topic, expected=20)  # read_committed
    counts = Counter(headers_of(m)["event_id"] for m in messages)
    assert counts == {str(e.id): 1 for e in first + second}


def test_the_long_running_relay_survives_losing_its_database_connections(kafka_topic, start_relay):
    from django.db import connection

    topic = kafka_topic()
    relay = start_relay()
    assert relay.stdout is not None
    assert "listening" in relay.stdout.readline()
    # What a PostgreSQL restart does to a client: every connection of the relay is cut.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1
    publish_events(topic, 5)
    wait_until(
        lambda: OutboxEvent.objects.filter(status="DONE").count() == 5,
        timeout=30,
        message="the relay to reconnect and publish",
    )
    assert relay.poll() is None, "the relay exited instead of reconnecting"
    relay.send_signal(signal.SIGTERM)
    assert relay.wait(30) == 0


def test_a_record_over_its_topic_limit_is_a_failed_attempt_without_asking_a_broker(kafka_topic):
    topic = kafka_topic(config={"max.message.bytes": "3000"})
    with transaction.atomic():
        event = outbox.publish(
            aggregate_type="o", aggregate_id="k", event_type="E", payload="x" * 4000, topic=topic
        )

    result = Relay().run_once()

    assert (result.claimed, result.failed, result.published) == (1, 1, 0)
    stored = OutboxEvent.objects.get(pk=event.pk)
    assert (stored.status, stored.attempts) == (OutboxEvent.Status.PENDING, 1)
    assert stored.last_error.startswith("RECORD_TOO_LARGE: the record takes up to ")
