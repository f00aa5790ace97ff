import json
import logging
import re
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import UTC, date, timedelta
from typing import Any, TypeVar

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

import outbox
from outbox import log_relay as log_relay_module
from outbox import metrics
from outbox.log_relay import HELD_KEYS_READ_WHOLE, LogRelay, LogRunResult, SentBatch
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.producer import close_producers
from outbox.relay import record_headers, transactional_id_for
from outbox.selectors import outbox_event_delivered
from outbox.services.event_log.deliveries import DeliveryRecord
from outbox.services.event_log.shards import ALL_SHARDS, SHARD_COUNT, shard_of, shards_lock
from outbox.services.event_log.spans import LogEvent
from outbox.services.event_log.ticks import Tick, tick_take
from outbox.services.partitions import partition_create
from outbox.services.repairs import outbox_events_discard
from outbox.services.retention import outbox_event_log_purge
from outbox.tasks import relay as relay_task
from outbox.tasks import worker_slot
from tests.conftest import connect_outside_django
from tests.outbox.conftest import (
    assert_order_per_key,
    consume_all,
    headers_of,
    payload_of,
    publish_events,
    wait_until,
)

T = TypeVar("T")

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def published_ids() -> Counter[str]:
    return Counter(
        str(event_id)
        for event_id in OutboxDelivery.objects.filter(
            outcome=OutboxDelivery.Outcome.PUBLISHED
        ).values_list("event_id", flat=True)
    )


def rows_written_again() -> int:
    """Event rows whose current version was not written by the transaction that inserted them
    (their txid): rows some later statement updated."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM outbox_event "
            "WHERE xmin::text::bigint <> txid::text::bigint % 4294967296"
        )
        return cursor.fetchone()[0]


def returns(function: Callable[..., T], results: list[T]) -> Callable[..., T]:
    """`function`, keeping what each call returns in `results`."""

    def keeping(**arguments: object) -> T:
        results.append(function(**arguments))
        return results[-1]

    return keeping


def insert_event_outside(session, *, topic: str, key: str, seq: int) -> uuid.UUID:
    """Writes an event as any other writer of the table would (not through Django)."""
    event_id = uuid.uuid4()
    session.execute(
        """
        INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic,
                                  key, created_at)
        VALUES (%s, 'order', %s, 'OrderPlaced', %s::jsonb, '{}', %s, %s, now())
        """,
        [event_id, key, f'{{"seq": {seq}}}', topic, key],
    )
    return event_id


def test_events_go_out_once_in_order_per_key_and_each_delivery_is_a_row(
    kafka_topic, kafka_consumer_config, log_relay
):
    topic = kafka_topic(partitions=3)
    events = []
    for start in range(0, 600, 60):  # ten transactions, spread over several batches
        events += publish_events(topic, 60, keys=7, start=start)
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.publish(
            aggregate_type="o", aggregate_id="x", event_type="E", payload={}, topic=topic
        )
        raise RuntimeError("rolled back")

    started = time.monotonic()
    result = log_relay(batch_size=100).run()
    run_ms = (time.monotonic() - started) * 1000

    assert (result.published, result.failed, result.held, result.drained) == (600, 0, 0, True)
    messages = consume_all(kafka_consumer_config, topic, expected=600)
    assert Counter(headers_of(m)["event_id"] for m in messages) == {str(e.id): 1 for e in events}
    assert_order_per_key(messages)
    deliveries = {str(d.event_id): d for d in OutboxDelivery.objects.all()}
    assert len(deliveries) == 600
    for message in messages:
        delivery = deliveries[headers_of(message)["event_id"]]
        assert delivery.outcome == OutboxDelivery.Outcome.PUBLISHED
        assert (delivery.kafka_partition, delivery.kafka_offset) == (
            message.partition(),
            message.offset(),
        )
        # How long its try took, from the hand-off to the producer to the report: within the run.
        assert 0 <= delivery.duration_ms <= run_ms
    # The event rows were never touched: each one's row version is still the one its own
    # transaction wrote (an UPDATE would have given it the relay's transaction id).
    assert rows_written_again() == 0
    assert log_relay().run().published == 0


def test_a_records_headers_are_those_its_event_makes_in_code(
    kafka_topic, kafka_consumer_config, log_relay
):
    """The relay has PostgreSQL format the id and the creation time of each event it reads;
    the record carries them exactly as str() and isoformat() make them, a fraction of zero
    microseconds left out too, with the event's own headers."""
    topic = kafka_topic()
    with connection.cursor() as cursor:
        for created_at, headers in [
            ("date_trunc('second', now())", "{}"),
            ("now()", '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'),
            ("'2026-03-01 23:59:59.000001+05:00'", '{"tenant": "é"}'),
        ]:
            cursor.execute(
                f"""
                INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers,
                                          topic, key, created_at)
                VALUES (gen_random_uuid(), 'order', 'o-1', 'OrderPlaced', '{{}}', %s, %s,
                        'o-1', {created_at})
                """,
                [headers, topic],
            )
    events = {str(event.id): event for event in OutboxEvent.objects.filter(topic=topic)}
    assert len(events) == 3
    assert any(event.created_at.microsecond == 0 for event in events.values())

    assert log_relay().run().published == 3

    for message in consume_all(kafka_consumer_config, topic, expected=3):
        event = events[headers_of(message)["event_id"]]
        [in_code] = _as_log_events([event])
        assert message.headers() == record_headers(in_code)
        assert headers_of(message)["created_at"] == event.created_at.astimezone(UTC).isoformat()


def test_a_backlog_is_read_a_batch_ahead_while_the_relay_sends(
    kafka_topic, kafka_consumer_config, log_relay, monkeypatch
):
    """A span larger than a batch: each batch after the first comes from the read made on the
    reader thread while the batch before it was sent, not from a read of its own."""
    topic = kafka_topic(partitions=3)
    events = publish_events(topic, 450, keys=7)
    reads: list[tuple[list[LogEvent], bool]] = []
    read_ahead: list[Future | None] = []
    monkeypatch.setattr(log_relay_module, "batch_read", returns(log_relay_module.batch_read, reads))
    monkeypatch.setattr(
        log_relay_module, "batch_prefetch", returns(log_relay_module.batch_prefetch, read_ahead)
    )

    assert log_relay(batch_size=100).run().published == 450

    messages = consume_all(kafka_consumer_config, topic, expected=450)
    assert Counter(headers_of(m)["event_id"] for m in messages) == {str(e.id): 1 for e in events}
    assert_order_per_key(messages)
    # Five batches: the first read on its own; four read ahead, each while one was sent. The
    # other reads found the spans after the backlog empty.
    span_reads = [read for read in reads if read[0]]
    assert len(span_reads) == 1
    assert len(span_reads[0][0]) == 100
    assert [len(ahead.result()[0]) for ahead in read_ahead if ahead] == [100, 100, 100, 50]


def test_a_read_ahead_that_failed_is_made_again_and_nothing_is_lost(
    kafka_topic, kafka_consumer_config, log_relay, monkeypatch
):
    topic = kafka_topic(partitions=3)
    events = publish_events(topic, 250, keys=7)
    failed: list[Exception] = []
    prefetch = log_relay_module.batch_prefetch

    def failing(**arguments: Any) -> Future | None:
        read = prefetch(**arguments)
        if read is None:
            return None
        read.result()
        failed.append(RuntimeError("the reader thread's read failed"))
        future: Future = Future()
        future.set_exception(failed[-1])
        return future

    monkeypatch.setattr(log_relay_module, "batch_prefetch", failing)

    assert log_relay(batch_size=100).run().published == 250

    assert len(failed) == 2  # after the first batch and the second
    messages = consume_all(kafka_consumer_config, topic, expected=250)
    assert Counter(headers_of(m)["event_id"] for m in messages) == {str(e.id): 1 for e in events}
    assert_order_per_key(messages)


def test_no_delivery_record_is_dated_before_its_event_whose_writer_clock_ran_ahead(
    kafka_topic, log_relay, settings
):
    """The readers of an event's records skip the delivery table's partitions before the
    event's creation (outbox.selectors), so the relay and a discard date a record no earlier
    than its event, whatever the writer's clock said."""
    topic = kafka_topic()
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_CONFIG": {"message.max.bytes": "4000"},
        "MAX_ATTEMPTS": 2,
    }
    ahead = timezone.now() + timedelta(hours=3)
    ids = {}
    with connect_outside_django(connection.settings_dict) as session:
        for key, payload in (("sent", '{"n": 1}'), ("refused", json.dumps({"x": "x" * 5000}))):
            ids[key] = uuid.uuid4()
            session.execute(
                """
                INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload,
                                          headers, topic, key, created_at)
                VALUES (%s, 'order', %s, 'OrderPlaced', %s::jsonb, '{}', %s, %s, %s)
                """,
                [ids[key], key, payload, topic, key, ahead],
            )

    relay = log_relay()
    first = relay.run()
    assert (first.published, first.failed) == (1, 1)
    OutboxHeldEvent.objects.update(next_attempt_at=timezone.now())
    assert relay.run().failed == 1  # its last attempt: it waits for an operator
    assert outbox_events_discard(event_ids=[ids["refused"]]) == 1

    records = list(OutboxDelivery.objects.all())
    assert Counter((r.event_id, r.outcome) for r in records) == {
        (ids["sent"], "PUBLISHED"): 1,
        (ids["refused"], "FAILED"): 2,
        (ids["refused"], "DISCARDED"): 1,
    }
    assert [record.published_at for record in records] == [ahead] * 4
    sent = outbox_event_delivered(event_id=ids["sent"])
    refused = outbox_event_delivered(event_id=ids["refused"])
    assert (sent.delivery_status, sent.delivered_at, sent.delivery_attempts) == ("DONE", ahead, 1)
    assert (refused.delivery_status, refused.delivery_discarded_at) == ("FAILED", ahead)
    assert "MSG_SIZE_TOO_LARGE" in refused.delivery_error


def test_an_event_whose_transaction_commits_after_later_ones_is_not_skipped(
    kafka_topic, kafka_consumer_config, log_relay
):
    topic = kafka_topic()
    relay = log_relay()
    # A reporting transaction holds its snapshot for the whole test, as pg_dump would.
    with connect_outside_django(connection.settings_dict, autocommit=True) as report:
        report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM outbox_event").fetchone()
        with connect_outside_django(connection.settings_dict) as slow_writer:
            late_id = insert_event_outside(slow_writer, topic=topic, key="late", seq=0)
            early = publish_events(topic, 3, keys=3, start=100)
            assert relay.run().published == 3
            # The relay moved on past events that committed meanwhile; the slow writer's
            # transaction began before them and commits only now.
            later = publish_events(topic, 2, keys=2, start=200)
            assert relay.run().published == 2
            slow_writer.commit()
        assert relay.run().published == 1
        report.execute("ROLLBACK")

    delivered = published_ids()
    assert delivered == {str(e.id): 1 for e in early + later} | {str(late_id): 1}
    messages = consume_all(kafka_consumer_config, topic, expected=6)
    assert sorted(headers_of(m)["event_id"] for m in messages) == sorted(delivered)


# With more held keys than a step reads whole (0 here), each batch asks which of its keys are
# held.
@pytest.mark.parametrize("held_keys_read_whole", [HELD_KEYS_READ_WHOLE, 0])
def test_a_failed_event_holds_its_key_until_it_goes_then_the_rest_follows_in_order(
    kafka_topic, kafka_consumer_config, log_relay, settings, monkeypatch, held_keys_read_whole
):
    monkeypatch.setattr("outbox.log_relay.HELD_KEYS_READ_WHOLE", held_keys_read_whole)
    topic = kafka_topic(partitions=2)
    # The producer refuses a record over 4,000 bytes: one event of key "a" is too large.
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_CONFIG": {"message.max.bytes": "4000"},
        "RETRY_BASE_SECONDS": 60,
    }
    with transaction.atomic():
        for seq in range(4):
            for key in ("a", "b"):
                big = key == "a" and seq == 1
                outbox.publish(
                    aggregate_type="order",
                    aggregate_id=key,
                    event_type="OrderPlaced",
                    payload={"seq": seq, "filler": "x" * (5000 if big else 10)},
                    topic=topic,
                )
    relay = log_relay()

    first = relay.run()

    assert (first.published, first.failed, first.held) == (5, 1, 2)  # a0, b0-b3; a1; a2, a3
    held = list(OutboxHeldEvent.objects.order_by("transaction_id", "position"))
    assert [(h.key, h.attempts) for h in held] == [("a", 1), ("a", 0), ("a", 0)]
    assert "MSG_SIZE_TOO_LARGE" in held[0].last_error
    assert held[0].next_attempt_at > timezone.now()  # backoff: not before its time
    assert relay.run().published == 0
    # Later events of the held key wait behind it; other keys are not held up.
    publish_events(topic, 2, keys=2, start=8)  # "order-0", "order-1": fresh keys
    with transaction.atomic():
        outbox.publish(
            aggregate_type="order",
            aggregate_id="a",
            event_type="E",
            payload={"seq": 4},
            topic=topic,
        )
    later = relay.run()
    assert (later.published, later.held) == (2, 1)

    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {}}
    close_producers()
    OutboxHeldEvent.objects.update(next_attempt_at=timezone.now())  # as an operator's retry
    released = relay.run()

    assert released.published == 4
    assert not OutboxHeldEvent.objects.exists()
    messages = consume_all(kafka_consumer_config, topic, expected=11)
    assert len(messages) == 11
    by_key: dict[bytes, list[int]] = {}
    for message in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        by_key.setdefault(message.key() or b"", []).append(payload_of(message)["seq"])
    assert by_key[b"a"] == [0, 1, 2, 3, 4]
    assert by_key[b"b"] == [0, 1, 2, 3]
    head_id = held[0].event_id
    assert list(
        OutboxDelivery.objects.filter(event_id=head_id).order_by("id").values_list("outcome")
    ) == [("FAILED",), ("PUBLISHED",)]


class CountsItsSends(LogRelay):
    """A relay that counts its sends: each is one wait for delivery reports."""

    sends = 0

    def _send(self, events: Sequence[LogEvent]) -> SentBatch:
        self.sends += 1
        return super()._send(events)


class RemembersItsBatches(LogRelay):
    """A relay that remembers how many events each of its sends held."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.batches: list[int] = []

    def _send(self, events: Sequence[LogEvent]) -> SentBatch:
        self.batches.append(len(events))
        return super()._send(events)


@pytest.mark.parametrize("batch_size", [1000, 10])
def test_a_batch_holds_about_batch_max_bytes_of_payload_and_at_least_one_event(
    kafka_topic, kafka_consumer_config, settings, batch_size
):
    topic = kafka_topic(partitions=2)
    # Payloads of about 1,500 bytes (stored uncompressed: under PostgreSQL's TOAST threshold),
    # with a bound of 4,000: the third event of a batch passes it, the fourth is not read.
    settings.OUTBOX = {**settings.OUTBOX, "BATCH_MAX_BYTES": 4000}
    with transaction.atomic():
        for seq in range(30):
            outbox.publish(
                aggregate_type="order",
                aggregate_id=f"order-{seq % 3}",
                event_type="OrderPlaced",
                payload={"seq": seq // 3, "filler": "x" * 1500},
                topic=topic,
            )
    # An event over the bound by itself still goes.
    with transaction.atomic():
        outbox.publish(
            aggregate_type="order",
            aggregate_id="order-0",
            event_type="OrderPlaced",
            payload={"seq": 10, "filler": "y" * 6000},
            topic=topic,
        )
    relay = RemembersItsBatches(batch_size=batch_size)
    try:
        assert relay.run().published == 31
    finally:
        relay.close()

    # With batches of 10 events the span is sent from the relay's span table; with 1,000 it
    # is read whole, cut at the bound, then sent from the span table the same way.
    assert max(relay.batches) == 3
    assert sum(relay.batches) == 31
    assert relay.batches[-1] == 1
    messages = consume_all(kafka_consumer_config, topic, expected=31)
    assert len(messages) == 31
    assert_order_per_key(messages)


def test_the_due_heads_of_many_held_keys_go_in_one_send_and_their_followers_in_one_more(
    kafka_topic, kafka_consumer_config, settings
):
    topic = kafka_topic(partitions=3)
    keys = [f"k{number}" for number in range(6)]
    # Every head is over the producer's first limit; k0's is over the second as well.
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_CONFIG": {"message.max.bytes": "2000"},
        "MAX_ATTEMPTS": 5,
    }
    with transaction.atomic():
        for seq in range(3):
            for key in keys:
                size = (5000 if key == "k0" else 3000) if seq == 0 else 10
                outbox.publish(
                    aggregate_type="order",
                    aggregate_id=key,
                    event_type="OrderPlaced",
                    payload={"seq": seq, "filler": "x" * size},
                    topic=topic,
                )
    relay = CountsItsSends()
    try:
        assert relay.run().held == 12  # six heads failed, two followers behind each
        settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {"message.max.bytes": "4000"}}
        close_producers()
        OutboxHeldEvent.objects.update(next_attempt_at=timezone.now())  # as operators' retries
        relay.sends = 0

        retried = relay.run()

        # The six heads in one send, the followers of the five that went in one more: not a
        # send (and a wait for its reports) per key.
        assert relay.sends == 2
        assert (retried.published, retried.failed) == (15, 1)
        head = OutboxHeldEvent.objects.order_by("position").first()
        assert head is not None
        assert (head.key, head.attempts) == ("k0", 2)
        assert OutboxHeldEvent.objects.filter(key="k0").count() == 3
        assert set(OutboxHeldEvent.objects.values_list("key", flat=True)) == {"k0"}
    finally:
        relay.close()
    messages = consume_all(kafka_consumer_config, topic, expected=15)
    by_key: dict[bytes, list[int]] = {}
    for message in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        by_key.setdefault(message.key() or b"", []).append(payload_of(message)["seq"])
    assert by_key == {key.encode(): [0, 1, 2] for key in keys[1:]}


def test_a_head_that_keeps_failing_waits_for_an_operator_after_its_last_attempt(
    kafka_topic, log_relay, settings
):
    topic = kafka_topic()
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_CONFIG": {"message.max.bytes": "4000"},
        "MAX_ATTEMPTS": 2,
    }
    with transaction.atomic():
        outbox.publish(
            aggregate_type="o", aggregate_id="k", event_type="E", payload="x" * 5000, topic=topic
        )
    relay = log_relay()
    relay.run()
    OutboxHeldEvent.objects.update(next_attempt_at=timezone.now())
    failed_before = metrics.FAILED.labels(topic=topic)._value.get()
    assert relay.run().failed == 1

    head = OutboxHeldEvent.objects.get()
    assert (head.attempts, head.next_attempt_at) == (2, None)
    assert metrics.FAILED.labels(topic=topic)._value.get() == failed_before + 1
    assert relay.run().failed == 0  # no longer tried by itself
    assert OutboxDelivery.objects.filter(outcome="FAILED").count() == 2


# A longer delivery timeout given in PRODUCER_CONFIG (refused by check outbox.E007) would
# leave the records in flight after the relay stopped waiting for them; the producer ignores it.
@pytest.mark.parametrize("extra_config", [{}, {"delivery.timeout.ms": 60_000}])
def test_with_the_broker_unreachable_the_batch_waits_and_no_key_is_held(
    kafka_topic, kafka_consumer_config, log_relay, settings, extra_config
):
    topic = kafka_topic()
    events = publish_events(topic, 5, keys=5)
    reachable = settings.KAFKA_EVENTS
    # Nothing listens there.
    settings.KAFKA_EVENTS = {**reachable, "BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_DELIVERY_TIMEOUT_MS": 1000,
        "PRODUCER_CONFIG": {**settings.OUTBOX.get("PRODUCER_CONFIG", {}), **extra_config},
    }
    during_outage = log_relay()

    started = time.monotonic()
    outage = during_outage.run(max_seconds=0.1)
    run_ms = (time.monotonic() - started) * 1000

    assert (outage.published, outage.failed, outage.held) == (0, 5, 0)
    assert not OutboxHeldEvent.objects.exists()
    assert set(OutboxDelivery.objects.values_list("outcome", flat=True)) == {"FAILED"}
    assert "_MSG_TIMED_OUT" in OutboxDelivery.objects.first().error
    # Each try lasted until the producer gave the record up: its delivery timeout (1,000 ms).
    durations = OutboxDelivery.objects.values_list("duration_ms", flat=True)
    assert all(900 <= duration <= run_ms for duration in durations), (list(durations), run_ms)
    during_outage.close()

    settings.KAFKA_EVENTS = reachable
    close_producers()
    # A relay that starts from what the first one wrote down finds the whole batch.
    assert log_relay().run().published == 5
    messages = consume_all(kafka_consumer_config, topic, expected=5)
    assert Counter(headers_of(m)["event_id"] for m in messages) == {str(e.id): 1 for e in events}


def _in_own_session(work: Callable[[], T]) -> T:
    """Runs `work` in a thread, hence on a database session of its own, closed at the end."""
    results: list[T] = []

    def target() -> None:
        try:
            results.append(work())
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(120)
    return results[0]


def test_relays_share_the_shards_and_one_takes_over_what_another_gave_up(
    kafka_topic, kafka_consumer_config, log_relay
):
    topic = kafka_topic(partitions=3)
    events = publish_events(topic, 400, keys=40)
    half = SHARD_COUNT // 2
    lower = log_relay(shards=range(half))
    upper = log_relay(shards=range(half, SHARD_COUNT))
    standby = log_relay()

    sent_by_lower = lower.run().published
    sent_by_upper = _in_own_session(upper.run).published

    upper_keys = {key for key in {e.key for e in events} if shard_of(key) >= half}
    assert 0 < len(upper_keys) < 40
    assert sent_by_upper == sum(1 for e in events if e.key in upper_keys)
    assert sent_by_lower + sent_by_upper == 400

    def standby_run() -> tuple[LogRunResult, tuple[int, ...]]:
        result = standby.run()
        owned = standby.owned
        standby.close()
        return result, owned

    # The upper relay's session has ended; the lower one's still holds its shards.
    result, owned = _in_own_session(standby_run)
    assert (result.published, owned) == (0, tuple(range(half, SHARD_COUNT)))
    more = publish_events(topic, 100, keys=40, start=400)
    lower.close()
    result, owned = _in_own_session(standby_run)
    assert (result.published, owned) == (100, ALL_SHARDS)

    messages = consume_all(kafka_consumer_config, topic, expected=500)
    assert Counter(headers_of(m)["event_id"] for m in messages) == {
        str(e.id): 1 for e in events + more
    }
    assert_order_per_key(messages)


def test_a_relay_killed_before_recording_its_batch_loses_nothing(
    kafka_topic, kafka_consumer_config, start_relay, log_relay
):
    topic = kafka_topic(partitions=3)
    events = publish_events(topic, 300, keys=50)

    doomed = start_relay(OUTBOX_FAULT_INJECTION="before-mark")
    assert doomed.wait(60) == -signal.SIGKILL
    # It produced a batch and died before writing anything of it down.
    assert not OutboxDelivery.objects.exists()

    survivor = log_relay()  # its session died with it, and its shards are free
    wait_until(lambda: survivor.run().drained and len(published_ids()) == 300, timeout=60)
    messages = consume_all(kafka_consumer_config, topic, expected=300)
    counts = Counter(headers_of(m)["event_id"] for m in messages)
    assert set(counts) == {str(e.id) for e in events}, "an event was lost"
    assert published_ids() == {str(e.id): 1 for e in events}
    # The killed relay's batch may be in the log twice (at least once); consumers drop copies.
    assert_order_per_key([m for m in messages if counts[headers_of(m)["event_id"]] == 1])


def test_the_long_running_log_relay_wakes_on_commit_and_stops_cleanly(kafka_topic, start_relay):
    topic = kafka_topic()
    relay = start_relay("--poll-seconds", "30")  # only a notification wakes it in time
    assert relay.stdout is not None
    assert "listening" in relay.stdout.readline()
    events = publish_events(topic, 3)
    wait_until(lambda: len(published_ids()) == 3, timeout=10, message="the three deliveries")
    relay.send_signal(signal.SIGTERM)
    assert relay.wait(40) == 0
    assert published_ids() == {str(e.id): 1 for e in events}


def test_retention_keeps_what_the_relay_still_needs(kafka_topic, log_relay, settings):
    topic = kafka_topic()
    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {"message.max.bytes": "4000"}}
    with transaction.atomic():
        outbox.publish(
            aggregate_type="o", aggregate_id="a", event_type="E", payload="x" * 5000, topic=topic
        )
    for start in range(0, 6, 2):
        publish_events(topic, 2, keys=2, start=start)
    relay = log_relay(batch_size=2)
    assert relay.run().published == 6
    OutboxEvent.objects.update(created_at=timezone.now() - timedelta(days=10))
    fresh = publish_events(topic, 3, keys=3, start=100)
    assert relay.run().published == 3
    relay.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM outbox_relay_cursor")
        cursors_before = cursor.fetchone()[0]

    deleted = outbox_event_log_purge(older_than=timezone.now() - timedelta(days=7), batch_size=4)

    assert (deleted["events"], deleted["deliveries"]) == (6, 6)
    assert deleted["cursors"] == cursors_before - 1  # all but the latest
    assert deleted["ticks"] > 0
    # The held event and the recent ones stay, with their records.
    assert OutboxEvent.objects.count() == 4
    assert OutboxHeldEvent.objects.count() == 1
    assert set(published_ids()) == {str(e.id) for e in fresh}
    # The relay goes on from where it was.
    more = publish_events(topic, 2, keys=2, start=200)
    assert log_relay().run().published == 2
    assert set(published_ids()) == {str(e.id) for e in fresh + more}


def test_beat_runs_the_relay_and_gives_its_shards_back(kafka_topic):
    events = publish_events(kafka_topic(), 5)

    assert relay_task() == 5

    assert published_ids() == {str(e.id): 1 for e in events}
    assert _in_own_session(lambda: shards_lock(shards=ALL_SHARDS)) == list(ALL_SHARDS)


def test_celery_workers_of_one_host_relay_under_transactional_ids_of_their_own(
    kafka_topic, settings, caplog
):
    settings.OUTBOX = {**settings.OUTBOX, "RELAY_TRANSACTIONAL": True}
    topic = kafka_topic()
    run = uuid.uuid4().hex[:8]
    # `celery worker -n a@%h` and `-n b@%h` on one host; a runs again after a restart.
    workers = [f"a-{run}@{socket.gethostname()}", f"b-{run}@{socket.gethostname()}"]
    ready: list[str] = []
    caplog.set_level(logging.DEBUG, logger="outbox.producer")

    for number, worker in enumerate([*workers, workers[0]]):
        publish_events(topic, 2, start=2 * number)
        relay_task.push_request(hostname=worker)  # what a worker's request carries
        try:
            assert relay_task.run() == 2
        finally:
            relay_task.pop_request()
            close_producers()  # the worker stops; its successor makes a producer afresh
        ready += [r.args[0] for r in caplog.records if "is ready" in r.getMessage()]
        caplog.clear()

    assert ready == [transactional_id_for(f"{worker}-main") for worker in [*workers, workers[0]]]
    assert len(set(ready)) == 2


def test_a_worker_slot_is_its_node_name_and_pool_child_index():
    assert worker_slot(worker_name="a@host", child_index=1) == "a@host-1"
    assert worker_slot(worker_name="a@host", child_index=2) == "a@host-2"
    assert worker_slot(worker_name="b@host", child_index=1) == "b@host-1"
    assert worker_slot(worker_name=None, child_index=None) == f"{socket.gethostname()}-main"


def test_a_record_over_its_topic_limit_is_refused_before_producing_and_holds_its_key(
    kafka_topic, kafka_consumer_config, log_relay
):
    topic = kafka_topic(config={"max.message.bytes": "3000"})
    with transaction.atomic():
        for seq, size in enumerate((10, 4000, 10)):
            outbox.publish(
                aggregate_type="o",
                aggregate_id="a",
                event_type="E",
                payload={"seq": seq, "filler": "x" * size},
                topic=topic,
            )
        outbox.publish(
            aggregate_type="o", aggregate_id="b", event_type="E", payload={}, topic=topic
        )

    result = log_relay().run()

    assert (result.published, result.failed, result.held) == (2, 1, 1)
    head = OutboxHeldEvent.objects.order_by("transaction_id", "position").first()
    assert head.last_error.startswith("RECORD_TOO_LARGE")
    assert f"topic {topic} takes at most 3000" in head.last_error
    # Refused by the relay itself, at once: no wait for a broker.
    refused = OutboxDelivery.objects.get(event_id=head.event_id)
    assert refused.outcome == "FAILED"
    assert 0 <= refused.duration_ms <= 50
    messages = consume_all(kafka_consumer_config, topic, expected=2)
    assert sorted((m.key(), payload_of(m).get("seq")) for m in messages) == [
        (b"a", 0),
        (b"b", None),
    ]


def _as_log_events(events: list[OutboxEvent]) -> list[LogEvent]:
    return [
        LogEvent(
            id=e.id,
            aggregate_type=e.aggregate_type,
            aggregate_id=e.aggregate_id,
            event_type=e.event_type,
            payload_json=json.dumps(e.payload),
            headers_json=json.dumps(e.headers),
            topic=e.topic,
            key=e.key,
            created_at=e.created_at,
            txid=0,
            position=e.position,
            shard=shard_of(e.key),
        )
        for e in events
    ]


def test_transactional_mode_fences_a_relay_that_lost_its_shards_and_sends_on(
    kafka_topic, kafka_consumer_config, start_relay, log_relay, settings
):
    settings.OUTBOX = {**settings.OUTBOX, "RELAY_TRANSACTIONAL": True}
    slot = f"fence-{uuid.uuid4().hex[:8]}"
    zombie = log_relay(transactional_id=transactional_id_for(slot))
    topic = kafka_topic(partitions=2)
    first = publish_events(topic, 10, keys=10)
    assert zombie.run().published == 10
    # Each try in the Kafka transaction is timed like any other.
    assert None not in OutboxDelivery.objects.values_list("duration_ms", flat=True)

    # The zombie loses its database session (and its shards with it) while it stalls; a
    # successor with its slot takes the shards over.
    second = publish_events(topic, 10, keys=10, start=10)
    connection.close()
    successor = start_relay("--slot", slot, OUTBOX_RELAY_TRANSACTIONAL="true")
    assert successor.stdout is not None
    assert "listening" in successor.stdout.readline()
    wait_until(lambda: len(published_ids()) == 20, timeout=60, message="the successor's batch")

    # The zombie wakes up and sends the batch it had read: its transaction is fenced and
    # nothing of it becomes visible; nor can it take back the shards.
    sent = zombie._send(_as_log_events(second))
    assert sent.fatal
    assert not sent.delivered
    assert zombie.run().published == 0
    assert zombie.owned == ()

    successor.send_signal(signal.SIGTERM)
    assert successor.wait(30) == 0
    messages = consume_all(kafka_consumer_config, topic, expected=20)  # read_committed
    assert Counter(headers_of(m)["event_id"] for m in messages) == {
        str(e.id): 1 for e in first + second
    }


def test_a_held_key_whose_events_were_deleted_is_let_go(kafka_topic, log_relay, settings):
    topic = kafka_topic()
    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {"message.max.bytes": "4000"}}
    with transaction.atomic():
        for size in (5000, 10):
            outbox.publish(
                aggregate_type="o",
                aggregate_id="k",
                event_type="E",
                payload="x" * size,
                topic=topic,
            )
    relay = log_relay()
    assert relay.run().held == 1
    OutboxEvent.objects.filter(topic=topic).delete()
    OutboxHeldEvent.objects.update(next_attempt_at=timezone.now())

    assert relay.run().failed == 0

    assert not OutboxHeldEvent.objects.exists()


def test_running_relays_split_the_shards_between_them(
    kafka_topic, kafka_consumer_config, log_relay
):
    topic = kafka_topic(partitions=3)
    first, second = log_relay(), log_relay()
    assert first.run().published == 0
    assert first.owned == ALL_SHARDS  # alone, it owns every shard
    second_joined, first_gave_back, checked = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    seen: dict[str, object] = {}

    def second_relay() -> None:
        try:
            seen["before"] = (second.run().published, second.owned)
            second_joined.set()
            first_gave_back.wait(60)
            seen["after"] = (second.run().published, second.owned)
            checked.set()
        finally:
            second.close()
            connections.close_all()

    thread = threading.Thread(target=second_relay)
    thread.start()
    second_joined.wait(60)
    events = publish_events(topic, 200, keys=40)
    # Two relays run: the first keeps half the shards and gives the others back.
    sent_by_first = first.run().published
    first_gave_back.set()
    checked.wait(60)
    thread.join(60)

    half = SHARD_COUNT // 2
    assert seen["before"] == (0, ())
    assert first.owned == tuple(range(half))
    sent_by_second, owned_by_second = seen["after"]
    assert owned_by_second == tuple(range(half, SHARD_COUNT))
    assert sent_by_first == sum(1 for e in events if shard_of(e.key) < half)
    assert sent_by_first + sent_by_second == 200
    messages = consume_all(kafka_consumer_config, topic, expected=200)
    assert Counter(headers_of(m)["event_id"] for m in messages) == {str(e.id): 1 for e in events}


def test_committed_events_reach_the_topic_exactly_as_recorded(
    kafka_topic, kafka_consumer_config, log_relay
):
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

    assert log_relay().run().published == 20

    messages = consume_all(kafka_consumer_config, topic, expected=20)
    assert len(messages) == 20
    by_id = {headers_of(m)["event_id"]: m for m in messages}
    assert set(by_id) == {str(event.id) for event in events}
    for event in events:
        stored = outbox_event_delivered(event_id=event.id)
        message = by_id[str(event.id)]
        assert stored.delivery_status == OutboxEvent.Status.DONE
        assert (stored.delivered_partition, stored.delivered_offset) == (
            message.partition(),
            message.offset(),
        )
        assert stored.delivered_at >= stored.created_at
        assert stored.delivery_attempts == 1
        assert message.key() == event.key.encode()
        assert json.loads(message.value().decode("utf-8")) == event.payload
        assert headers_of(message) == {
            "event_id": str(event.id),
            "event_type": "PaymentCompleted",
            "aggregate_type": "payment",
            "aggregate_id": event.aggregate_id,
            "created_at": stored.created_at.astimezone(UTC).isoformat(),
            "content-type": "application/json",
            "traceparent": traceparent,
        }
    assert_order_per_key(messages)


def test_two_relays_running_over_5000_events_publish_each_once(
    kafka_topic, kafka_consumer_config, start_relay
):
    topic = kafka_topic(partitions=6)
    relays = [start_relay("--batch-size", "500"), start_relay("--batch-size", "500")]
    for relay in relays:  # both ready before the first event, so that they share the work
        assert relay.stdout is not None
        assert "listening" in relay.stdout.readline()
    events = []
    for start in range(0, 5000, 1000):
        events += publish_events(topic, 1000, keys=1000, start=start)

    wait_until(lambda: len(published_ids()) == 5000, timeout=240, message="every event DONE")
    published_by_relay = []
    for relay in relays:
        relay.send_signal(signal.SIGTERM)
        output, _ = relay.communicate(timeout=30)
        assert relay.returncode == 0, output
        match = re.search(r"after publishing (\d+) events", output)
        assert match, output
        published_by_relay.append(int(match[1]))
    messages = consume_all(kafka_consumer_config, topic, expected=5000)
    counts = Counter(headers_of(m)["event_id"] for m in messages)
    assert counts == {str(e.id): 1 for e in events}, "an event was lost or published twice"
    assert published_ids() == counts
    assert_order_per_key(messages)
    # Both relays took part, so the work was really shared, and each event went out once.
    assert all(published_by_relay), published_by_relay
    assert sum(published_by_relay) == 5000


def test_a_run_says_whether_it_drained_or_stopped_at_its_deadline(kafka_topic, log_relay):
    # outbox_relay waits for a notification only after a drained run; after a run stopped at
    # its deadline it goes on at once, or a backlog would drain at half speed.
    publish_events(kafka_topic(), 3, keys=3)
    relay = log_relay(batch_size=1)
    stopped = relay.run(max_seconds=1e-6)
    assert (stopped.published, stopped.drained) == (1, False)
    rest = relay.run()
    assert (rest.published, rest.drained) == (2, True)


def test_the_long_running_relay_survives_losing_its_database_connections(kafka_topic, start_relay):
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
    events = publish_events(topic, 5)
    wait_until(
        lambda: len(published_ids()) == 5, timeout=30, message="the relay to reconnect and publish"
    )
    assert relay.poll() is None, "the relay exited instead of reconnecting"
    relay.send_signal(signal.SIGTERM)
    assert relay.wait(30) == 0
    assert published_ids() == {str(e.id): 1 for e in events}


class LosesItsSessionWhileSending(LogRelay):
    """A relay whose database session ends while its batch is on its way to Kafka (what a
    network cut or a pg_terminate_backend does); it connects again to write the batch down."""

    def _send(self, events: Sequence[LogEvent]) -> SentBatch:
        sent = super()._send(events)
        connection.close()
        return sent


def test_a_relay_that_lost_its_session_records_nothing_and_another_takes_its_batch_over(
    kafka_topic, kafka_consumer_config, log_relay, caplog
):
    topic = kafka_topic(partitions=3)
    events = publish_events(topic, 20, keys=5)
    relay = LosesItsSessionWhileSending()
    try:
        with caplog.at_level(logging.WARNING, logger="outbox.log_relay"):
            result = relay.run()
        # Its shards went with its session: it wrote down neither the deliveries nor a new
        # cursor (another relay may own the shards and their cursor by now).
        assert "lost its shards" in caplog.text
        assert result.published == 0
        assert relay.owned == ()
        assert not OutboxDelivery.objects.exists()
    finally:
        relay.close()
    successor = log_relay()
    wait_until(lambda: successor.run().drained and len(published_ids()) == 20, timeout=60)
    assert published_ids() == {str(e.id): 1 for e in events}
    # The lost batch was produced once by each relay: in the log twice, recorded once.
    messages = consume_all(kafka_consumer_config, topic, expected=40)
    assert Counter(headers_of(m)["event_id"] for m in messages) == {str(e.id): 2 for e in events}


class RecordsBeforeProducing(LogRelay):
    """A deliberately broken relay: writes its batch down as delivered (records and cursor)
    without producing it, as a relay that records before the delivery report and dies
    before the records reach Kafka would."""

    def _send(self, events: Sequence[LogEvent]) -> SentBatch:
        now = timezone.now()
        return SentBatch(
            delivered=[
                DeliveryRecord(
                    event_id=event.id,
                    outcome=OutboxDelivery.Outcome.PUBLISHED,
                    published_at=now,
                    partition=0,
                    offset=0,
                )
                for event in events
            ],
            failed=[],
            fatal=False,
        )


def test_the_loss_check_catches_a_relay_that_records_before_the_delivery_report(
    kafka_topic, kafka_consumer_config, log_relay
):
    # The check of test_a_relay_killed_before_recording_its_batch_loses_nothing, against a
    # broken relay.
    topic = kafka_topic()
    events = publish_events(topic, 20, keys=20)
    broken = RecordsBeforeProducing(batch_size=5)
    try:
        assert broken.run(max_seconds=1e-6).published == 5
    finally:
        broken.close()
    assert log_relay().run().published == 15
    messages = consume_all(kafka_consumer_config, topic, expected=20, timeout=10)
    lost = {str(e.id) for e in events} - {headers_of(m)["event_id"] for m in messages}
    assert len(lost) == 5


def test_a_tick_walks_the_index_of_a_day_partition_not_yet_analyzed():
    # A day far ahead: its partition is new, and no ANALYZE has told the planner its size, as
    # with each new day's partition until autovacuum first gets to it.
    day_partition = partition_create(table="outbox_event", day=date(2099, 1, 1))
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO outbox_tick (snapshot) SELECT pg_current_snapshot() "
                "RETURNING id, snapshot::text, taken_at"
            )
            after = Tick(*cursor.fetchone())
            cursor.execute(
                """
                INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload,
                                          headers, topic, key, created_at)
                SELECT gen_random_uuid(), 'order', 'order-' || n, 'OrderPlaced',
                       jsonb_build_object('seq', n, 'note', repeat('x', 1000)), '{}',
                       'orders', 'order-' || n,
                       '2099-01-01T00:00Z'::timestamptz + n * interval '1 ms'
                FROM generate_series(1, 5000) AS n
                """
            )
            cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [day_partition])
            assert cursor.fetchone()[0] < 0  # never analyzed
            with transaction.atomic():
                # PostgreSQL's counts of the scans of the partition and of the entries read
                # from its index of commit order, by this session, not yet flushed: read
                # before and after the tick in one transaction, which flushes none.
                scans_before = _scans_of(cursor, day_partition)
                tick = tick_take(after=after)
                scans_after = _scans_of(cursor, day_partition)
        assert tick is not None
        sequential, index_entries = (
            later - earlier for later, earlier in zip(scans_after, scans_before, strict=True)
        )
        # One entry: the first event above the earlier tick's oldest transaction is new.
        assert (sequential, index_entries) == (0, 1)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {day_partition}")


def _scans_of(cursor, partition: str) -> tuple[int, int]:
    """(sequential scans of `partition`, entries read from its index on (txid, position)) in
    this session's counts not yet flushed."""
    cursor.execute(
        """
        SELECT pg_stat_get_xact_numscans(%s::regclass),
               pg_stat_get_xact_tuples_returned(%s::regclass)
        """,
        [partition, f"{partition}_txid_position_idx"],
    )
    return cursor.fetchone()
