"""inbox/consumer.py against real Kafka and PostgreSQL, in this process."""

import uuid

import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from django.db import connection

from inbox import handler
from inbox.consumer import InboxConsumer
from inbox.models import ConsumerOffset, InboxMessage
from inbox.records import synthetic_event_id
from inbox.registry import HandlerRegistry
from inbox.services.recording import BatchResult
from kafka_events.kafka import kafka_connection_config
from tests.app_settings import override_app_settings
from tests.inbox.conftest import consume_for, consume_until, effect_counts, record_effect
from tests.inbox.factories import Event, make_events, produce, produce_raw

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def unique_group() -> str:
    return f"test-inbox-{uuid.uuid4().hex[:10]}"


def committed_offsets(group: str, topic: str, partitions: int = 1) -> list[int]:
    consumer = Consumer({**kafka_connection_config(), "group.id": group})
    try:
        result = consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=10
        )
        return [tp.offset for tp in result]
    finally:
        consumer.close()


def effect_handler(
    registry: HandlerRegistry, *, group: str, topic: str, event_type: str = "OrderPlaced"
) -> list[str]:
    seen: list[str] = []

    @handler(event_type=event_type, topic=topic, group=group)
    def apply(message: InboxMessage) -> None:
        seen.append(message.event_id)
        record_effect(group=group, event_id=message.event_id)

    return seen


def test_an_event_delivered_three_times_runs_its_handler_once(
    kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    event = Event()
    consumer = run_consumer(group=group)

    # Three deliveries in three separate batches: the first records and runs the handler.
    for delivery in range(3):
        produce(topic, [event])

        def recorded(duplicates: int = delivery) -> bool:
            return InboxMessage.objects.filter(
                consumer_group=group, event_id=event.event_id, duplicate_count=duplicates
            ).exists()

        consume_until(consumer, recorded)

    message = InboxMessage.objects.get(consumer_group=group, event_id=event.event_id)
    assert seen == [event.event_id]
    assert effect_counts(group) == {event.event_id: 1}
    assert message.status == InboxMessage.Status.DONE
    assert message.duplicate_count == 2
    assert message.last_duplicate_at is not None
    assert message.attempts == 1
    assert (message.topic, message.partition, message.offset) == (topic, 0, 0)
    assert message.payload == event.payload
    assert message.key == event.aggregate_id
    assert message.headers["created_at"] == event.created_at.isoformat()
    assert message.published_at is not None
    assert message.processed_at is not None
    assert committed_offsets(group, topic) == [3]


def test_duplicates_within_one_batch_are_counted_and_run_nothing(
    kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    event, other = Event(), Event()
    produce(topic, [event, event, other, event])
    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: InboxMessage.objects.filter(consumer_group=group).count() == 2)

    assert sorted(seen) == sorted([event.event_id, other.event_id])
    message = InboxMessage.objects.get(consumer_group=group, event_id=event.event_id)
    assert message.duplicate_count == 2
    assert message.offset == 0


def test_events_of_one_group_do_not_dedup_another_group(
    kafka_topic, inbox_registry, effects, run_consumer
):
    topic, first, second = kafka_topic(), unique_group(), unique_group()
    effect_handler(inbox_registry, group=first, topic=topic)
    effect_handler(inbox_registry, group=second, topic=topic)
    produce(topic, [Event()])
    for group in (first, second):
        consumer = run_consumer(group=group)
        consume_until(consumer, lambda: effect_counts(group))  # noqa: B023
    assert InboxMessage.objects.filter(duplicate_count=0).count() == 2


@override_app_settings("INBOX", UNKNOWN_EVENT_TYPE="fail")
def test_poison_records_are_recorded_failed_and_the_consumer_goes_on(
    kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    good = Event()
    not_json = Event()
    not_utf8 = Event()
    unknown = Event(event_type="NobodyHandlesThis")
    produce_raw(topic, value=b"{not json", headers=not_json.headers())
    produce_raw(topic, value=b"\xff\xfe\x00binary", headers=not_utf8.headers())
    produce_raw(topic, value=b'{"a": 1}', headers=[("event_type", b"OrderPlaced")])  # no event_id
    produce(topic, [unknown, good])

    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: seen)

    assert seen == [good.event_id]
    rows = {m.offset: m for m in InboxMessage.objects.filter(consumer_group=group)}
    assert [rows[o].status for o in range(5)] == ["FAILED"] * 4 + ["DONE"]
    assert rows[0].last_error.startswith("invalid_payload:")
    assert (rows[0].raw_value, rows[0].raw_value_encoding) == ("{not json", "utf-8")
    assert rows[0].payload is None
    assert rows[0].event_id == not_json.event_id
    assert rows[1].raw_value_encoding == "base64"
    assert rows[1].raw_value == "//4AYmluYXJ5"
    assert rows[2].last_error.startswith("missing_event_id:")
    assert rows[2].payload == {"a": 1}
    assert rows[3].last_error.startswith("unknown_event_type:")
    assert rows[3].payload == unknown.payload
    assert committed_offsets(group, topic) == [5]

    # Redelivered (another Kafka group id for the same inbox group reads from the start):
    # the record without event_id gets the same synthetic id, so it is a duplicate too.
    replay = run_consumer(group=group, config_overrides={"group.id": unique_group()})
    consume_until(
        replay,
        lambda: InboxMessage.objects.filter(consumer_group=group, duplicate_count=1).count() == 5,
    )
    assert InboxMessage.objects.filter(consumer_group=group).count() == 5
    assert seen == [good.event_id]


def test_unknown_event_types_are_ignored_by_default(
    kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    unknown, good = Event(event_type="SomethingElse"), Event()
    produce(topic, [unknown, good])
    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: seen)
    assert list(InboxMessage.objects.values_list("event_id", flat=True)) == [good.event_id]
    assert committed_offsets(group, topic) == [2]


@override_app_settings("INBOX", MAX_ATTEMPTS=1)
def test_a_failing_handler_leaves_a_failed_row_that_succeeds_on_retry(
    kafka_topic, inbox_registry, effects, run_consumer
):
    from inbox.services.repairs import inbox_message_replay
    from inbox.tasks import retry_due

    topic, group = kafka_topic(), unique_group()
    failing, fine = Event(), Event()
    broken = {"yes": True}

    @handler(event_type="OrderPlaced", topic=topic, group=group)
    def apply(message: InboxMessage) -> None:
        record_effect(group=group, event_id=message.event_id)
        if broken["yes"] and message.event_id == failing.event_id:
            raise RuntimeError("the warehouse API is down")

    produce(topic, [failing, fine])
    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: InboxMessage.objects.filter(consumer_group=group).count() == 2)

    row = InboxMessage.objects.get(event_id=failing.event_id)
    assert row.status == InboxMessage.Status.FAILED
    assert row.attempts == 1
    assert row.last_error.startswith("builtins.RuntimeError: the warehouse API is down")
    assert "in apply" in row.last_error  # the short traceback names the handler
    assert row.payload == failing.payload
    # The failed handler's savepoint rolled back; the partition moved on past it.
    assert effect_counts(group) == {fine.event_id: 1}
    assert committed_offsets(group, topic) == [2]

    broken["yes"] = False
    inbox_message_replay(message=row)
    retry_due.delay()
    row.refresh_from_db()
    assert row.status == InboxMessage.Status.DONE
    assert row.last_error == ""
    assert effect_counts(group) == {failing.event_id: 1, fine.event_id: 1}


@pytest.mark.parametrize(
    ("protocol", "strategy"),
    [("classic", "range"), ("classic", "cooperative-sticky"), ("consumer", None)],
)
def test_exactly_once_mode_seeks_to_the_stored_offset_on_assignment(
    kafka_topic, inbox_registry, effects, run_consumer, monkeypatch, protocol, strategy
):
    from inbox import consumer as consumer_module

    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    events = make_events(5)
    produce(topic, events)
    # As if offsets 0 and 1 had been applied by an earlier run whose Kafka commit was lost.
    ConsumerOffset.objects.create(consumer_group=group, topic=topic, partition=0, next_offset=2)
    # The offsets the consumer fetched: the batch's own filter would hide a missing seek.
    fetched: list[int] = []
    real_parse_record = consumer_module.parse_record

    def parse_record(message: Message):
        fetched.append(message.offset() or 0)
        return real_parse_record(message)

    monkeypatch.setattr(consumer_module, "parse_record", parse_record)
    results: list[BatchResult] = []

    with override_app_settings("INBOX", GROUP_PROTOCOL=protocol):
        consumer = run_consumer(
            group=group,
            exactly_once=True,
            on_batch=results.append,
            config_overrides={"partition.assignment.strategy": strategy} if strategy else {},
        )
    assert consumer.config["group.protocol"] == protocol
    consume_until(consumer, lambda: len(seen) == 3)
    consume_for(consumer, 1.0)

    assert fetched == [2, 3, 4]
    assert sum(result.skipped for result in results) == 0
    assert seen == [e.event_id for e in events[2:]]
    stored = ConsumerOffset.objects.get(consumer_group=group, topic=topic, partition=0)
    assert stored.next_offset == 5
    assert committed_offsets(group, topic) == [5]


def test_on_revoke_the_in_flight_batch_is_finished_and_committed(
    kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    events = make_events(3)
    produce(topic, events)
    consumer = run_consumer(group=group, exactly_once=True)
    # Take records off the consumer without recording them: they are the batch in flight.
    in_flight: list[Message] = []
    while len(in_flight) < 3:
        message = consumer.consumer.poll(0.5)
        if message is not None:
            in_flight.append(message)
    consumer._in_flight = in_flight

    consumer._on_revoke(consumer.consumer, consumer.consumer.assignment())

    assert seen == [e.event_id for e in events]
    assert committed_offsets(group, topic) == [3]
    assert ConsumerOffset.objects.get(consumer_group=group).next_offset == 3


def test_on_loss_the_in_flight_batch_is_dropped_uncommitted(
    kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    produce(topic, make_events(2))
    consumer = run_consumer(group=group)
    in_flight: list[Message] = []
    while len(in_flight) < 2:
        message = consumer.consumer.poll(0.5)
        if message is not None:
            in_flight.append(message)
    consumer._in_flight = in_flight

    consumer._on_lost(consumer.consumer, consumer.consumer.assignment())

    assert consumer._in_flight == []
    assert seen == []
    assert not InboxMessage.objects.exists()
    assert committed_offsets(group, topic) == [-1001]  # OFFSET_INVALID: nothing committed


def test_records_of_a_revoked_partition_are_left_to_its_new_owner(
    kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    produce(topic, make_events(1))
    consumer = run_consumer(group=group)
    message = None
    while message is None:
        message = consumer.consumer.poll(0.5)
    consumer._assigned.clear()  # as after a revoke inside consume()

    assert consumer._process([message]) is None
    assert seen == []


def test_a_batch_that_cannot_be_recorded_is_rewound_and_retried(
    kafka_topic, inbox_registry, effects, run_consumer, monkeypatch
):
    from inbox import consumer as consumer_module

    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    events = make_events(3)
    produce(topic, events)
    calls = {"n": 0}
    real = consumer_module.inbox_message_record_batch

    def flaky(**kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database went away")
        return real(**kwargs)

    monkeypatch.setattr(consumer_module, "inbox_message_record_batch", flaky)
    monkeypatch.setattr(consumer_module, "ERROR_BACKOFF_SECONDS", 0.01)
    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: len(seen) == 3)
    assert calls["n"] >= 2
    assert seen == [e.event_id for e in events]
    assert committed_offsets(group, topic) == [3]


@override_app_settings("INBOX", UNKNOWN_EVENT_TYPE="fail")
def test_nul_bytes_in_keys_and_headers_do_not_stall_the_partition(
    kafka_topic, inbox_registry, effects, run_consumer
):
    # UTF-8 allows NUL; PostgreSQL's text and jsonb do not: a batch carrying one must still
    # be recorded, or the consumer would rewind and retry it forever.
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    first, nul_key, nul_header, nul_event_id, nul_event_type, last = make_events(6)
    produce(topic, [first])
    produce_raw(topic, key=b"order\x0042", value=nul_key.value, headers=nul_key.headers())
    produce_raw(
        topic,
        value=nul_header.value,
        headers=[*nul_header.headers(), ("traceparent", b"00-\x00-01")],
    )
    produce_raw(
        topic,
        value=nul_event_id.value,
        headers=[
            ("event_id", nul_event_id.event_id.encode() + b"\x00"),
            *nul_event_id.headers()[1:],
        ],
    )
    produce_raw(
        topic,
        value=nul_event_type.value,
        headers=[*nul_event_type.headers(), ("event_type", b"Order\x00Placed")],
    )
    produce(topic, [last], partition=0)

    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: last.event_id in seen, timeout=20)

    # The key and the other header are stored with the NUL escaped; those records run.
    assert seen == [first.event_id, nul_key.event_id, nul_header.event_id, last.event_id]
    rows = {m.offset: m for m in InboxMessage.objects.filter(consumer_group=group)}
    assert [rows[o].status for o in range(6)] == ["DONE"] * 3 + ["FAILED"] * 2 + ["DONE"]
    assert rows[1].key == "order\\x0042"
    assert rows[2].headers["traceparent"] == "base64:MDAtAC0wMQ=="
    # An event_id or event_type it cannot store is a poison record, its bytes kept base64.
    assert rows[3].last_error.startswith("invalid_headers:")
    assert rows[3].event_id == synthetic_event_id(topic=topic, partition=0, offset=3)
    assert rows[3].headers["event_id"].startswith("base64:")
    assert rows[3].payload == nul_event_id.payload
    assert rows[4].last_error.startswith("invalid_headers:")
    assert rows[4].event_type == "base64:T3JkZXIAUGxhY2Vk"
    assert committed_offsets(group, topic) == [6]


def test_exactly_once_assignment_waits_for_the_database_then_seeks(
    kafka_topic, inbox_registry, effects, run_consumer, monkeypatch
):
    from django.db import OperationalError

    from inbox import consumer as consumer_module

    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    events = make_events(4)
    produce(topic, events)
    ConsumerOffset.objects.create(consumer_group=group, topic=topic, partition=0, next_offset=2)
    reads = {"n": 0}
    real_read = consumer_module.consumer_offsets_for

    def database_down_twice(**kwargs):
        reads["n"] += 1
        if reads["n"] <= 2:
            raise OperationalError("connection refused")
        return real_read(**kwargs)

    monkeypatch.setattr(consumer_module, "consumer_offsets_for", database_down_twice)
    monkeypatch.setattr(consumer_module, "ERROR_BACKOFF_SECONDS", 0.01)
    fetched: list[int] = []
    real_parse_record = consumer_module.parse_record

    def parse_record(message: Message):
        fetched.append(message.offset() or 0)
        return real_parse_record(message)

    monkeypatch.setattr(consumer_module, "parse_record", parse_record)

    consumer = run_consumer(group=group, exactly_once=True)
    consume_until(consumer, lambda: len(seen) == 2)

    assert reads["n"] == 3
    assert fetched == [2, 3]  # read from the stored offset, once the database answered
    assert seen == [e.event_id for e in events[2:]]


def test_a_consumer_stopped_while_waiting_for_the_database_reads_nothing(
    kafka_topic, inbox_registry, effects, monkeypatch
):
    from django.db import OperationalError

    from inbox import consumer as consumer_module

    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    produce(topic, make_events(2))
    consumer = InboxConsumer(group=group, exactly_once=True, poll_timeout=0.2)

    def database_down(**kwargs):
        consumer.stop()  # SIGTERM while the database is down
        raise OperationalError("connection refused")

    monkeypatch.setattr(consumer_module, "consumer_offsets_for", database_down)
    consumer.run()  # returns: the stop is honoured inside the assignment

    assert seen == []
    assert not InboxMessage.objects.filter(consumer_group=group).exists()
    assert committed_offsets(group, topic) == [-1001]


def _lose_the_last_commits(group: str, topic: str, lost: list[Event], next_offset: int) -> None:
    """What a primary that failed over without the group's last transactions holds: neither
    their inbox rows, nor their effects, nor the stored next offset past them. The consumer's
    session ended with the old primary."""
    lost_ids = [event.event_id for event in lost]
    InboxMessage.objects.filter(consumer_group=group, event_id__in=lost_ids).delete()
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM inbox_test_effect WHERE consumer_group = %s AND event_id = ANY(%s)",
            [group, lost_ids],
        )
    ConsumerOffset.objects.filter(consumer_group=group, topic=topic).update(next_offset=next_offset)
    connection.close()


def _consume_across_a_failover(kafka_topic, inbox_registry, run_consumer) -> tuple[str, list]:
    topic, group = kafka_topic(), unique_group()
    seen = effect_handler(inbox_registry, group=group, topic=topic)
    events = make_events(10)
    produce(topic, events[:6])
    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: len(seen) == 6)
    assert committed_offsets(group, topic) == [6]
    _lose_the_last_commits(group, topic, events[3:6], next_offset=3)
    # The consumer's position stays at 6, past what the database holds.
    produce(topic, events[6:])
    consume_until(consumer, lambda: len(seen) >= 7)
    consume_for(consumer, 2.0)
    return group, events


def test_a_consumer_reads_again_what_a_failed_over_database_lost(
    kafka_topic, inbox_registry, effects, run_consumer, caplog
):
    group, events = _consume_across_a_failover(kafka_topic, inbox_registry, run_consumer)
    # Its first batch on the new session started at 6, the database holding 3: it read the
    # partition again from 3. Every event has its effect once.
    assert "starts past the stored next offset" in caplog.text
    assert "[0] at 6, stored 3" in caplog.text
    assert effect_counts(group) == {event.event_id: 1 for event in events}
    assert ConsumerOffset.objects.get(consumer_group=group).next_offset == 10


def test_the_failover_test_catches_a_consumer_that_trusts_its_kafka_position(
    kafka_topic, inbox_registry, effects, run_consumer, monkeypatch
):
    """The test above can fail: a consumer that does not check its position against the
    database after a new session never applies the events the database lost."""
    from inbox import consumer as consumer_module

    real = consumer_module.inbox_message_record_batch

    def unchecked(**kwargs):
        return real(**{**kwargs, "check_positions": None})

    monkeypatch.setattr(consumer_module, "inbox_message_record_batch", unchecked)
    group, events = _consume_across_a_failover(kafka_topic, inbox_registry, run_consumer)
    assert effect_counts(group) == {event.event_id: 1 for event in events[:3] + events[6:]}
