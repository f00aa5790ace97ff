"""The event-log relay's promise in production's ordinary cases: order per key by commit for
writers that take the aggregate's lock after their transaction id, no read slowed by a writer
that holds a transaction open, a replay sent in a quiet database, no shard worked by a session
that lost its locks."""

import secrets
import time
import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

import outbox
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.producer import close_producers, get_producer
from outbox.relay import publish_batch_in_transaction, transactional_id_for
from outbox.services.event_log.cursors import cursors_read
from outbox.services.event_log.shards import ALL_SHARDS, SHARD_COUNT, shard_of
from outbox.services.repairs import outbox_event_replay
from tests.conftest import connect_outside_django
from tests.outbox.conftest import (
    consume_all,
    event_rows_read,
    headers_of,
    payload_of,
    publish_events,
    wait_until,
)
from tests.outbox.test_log_relay import _as_log_events, insert_event_outside

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def _lock_aggregate(session, aggregate: str) -> None:
    """The aggregate's lock, as a writer that updates the aggregate's row takes it: held until
    its transaction ends."""
    session.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [aggregate])


@pytest.mark.parametrize("batch_size", [100, 1], ids=["span-in-one-batch", "batch-of-one"])
def test_a_key_goes_in_commit_order_when_the_first_transaction_id_locks_last(
    kafka_topic, kafka_consumer_config, log_relay, batch_size
):
    topic = kafka_topic()
    relay = log_relay(batch_size=batch_size)
    assert relay.run().published == 0  # the relay's tick is taken: both commit after it
    with (
        connect_outside_django(connection.settings_dict) as first,
        connect_outside_django(connection.settings_dict) as second,
        connect_outside_django(connection.settings_dict) as third,
    ):
        # `first` gets its transaction id first (it wrote something else: an audit row, an
        # inbox row) and takes the aggregate's lock last; `second` and `third` follow it.
        first_xid = int(first.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        second_xid = int(second.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        _lock_aggregate(third, "order-1")
        insert_event_outside(third, topic=topic, key="order-1", seq=1)
        third.commit()
        _lock_aggregate(second, "order-1")
        insert_event_outside(second, topic=topic, key="order-1", seq=2)
        second.commit()
        _lock_aggregate(first, "order-1")
        insert_event_outside(first, topic=topic, key="order-1", seq=3)
        first.commit()
    assert first_xid < second_xid  # the fault: transaction ids against commit order

    assert relay.run().published == 3

    messages = consume_all(kafka_consumer_config, topic, expected=3)
    assert [payload_of(m)["seq"] for m in messages] == [1, 2, 3]


def test_a_writer_idle_in_its_transaction_does_not_make_the_relay_read_again_what_it_sent(
    kafka_topic, log_relay, without_sequential_scans
):
    topic = kafka_topic()
    relay = log_relay()
    assert relay.run().published == 0
    with connect_outside_django(connection.settings_dict) as writer:
        # A transaction id held, the session idle: every snapshot's xmin stays at it.
        writer_pid = writer.execute("SELECT pg_backend_pid()").fetchone()[0]
        writer.execute("SELECT pg_current_xact_id()")
        for start in range(0, 3000, 1000):
            publish_events(topic, 1000, start=start)
            assert relay.run().published == 1000
        publish_events(topic, 1, start=3000)
        before = event_rows_read()

        assert relay.run().published == 1

        entries = event_rows_read() - before
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT state, backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = %s",
                [writer_pid],
            )
            state = cursor.fetchone()
        writer.rollback()
    # The tick and the span read find the one new event without walking the 3,000 committed
    # since the writer's transaction began (a read from the snapshots' xmin walks them all).
    assert entries <= 20, entries
    assert state == ("idle in transaction", True)


def test_a_span_begun_by_a_cursor_of_transaction_order_is_sent_again_whole(
    kafka_topic, kafka_consumer_config, log_relay
):
    """A cursor inside a span recorded by a version that sent a span in transaction order
    says nothing of position order: the span goes again from its start (copies, no loss)."""
    topic = kafka_topic()
    [start] = cursors_read(shards=ALL_SHARDS)
    events = publish_events(topic, 6, keys=2)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO outbox_tick (snapshot) VALUES (pg_current_snapshot()) RETURNING id"
        )
        until_tick_id = cursor.fetchone()[0]
        # Half the span done, by (txid, position) of the third event.
        cursor.execute(
            """
            INSERT INTO outbox_relay_cursor (shards, tick_id, until_tick_id, txid, position,
                                             relay)
            VALUES (%s::smallint[], %s, %s, %s::xid8, %s, 'earlier version')
            """,
            [
                list(ALL_SHARDS),
                start.tick_id,
                until_tick_id,
                str(events[2].transaction_id),
                events[2].position,
            ],
        )
    [cursor_read] = cursors_read(shards=ALL_SHARDS)
    assert (cursor_read.until_tick_id, cursor_read.position) == (until_tick_id, 0)

    assert log_relay().run().published == 6

    messages = consume_all(kafka_consumer_config, topic, expected=6)
    assert sorted(headers_of(m)["event_id"] for m in messages) == sorted(str(e.id) for e in events)


def _published_records(event_id: uuid.UUID) -> int:
    return OutboxDelivery.objects.filter(
        event_id=event_id, outcome=OutboxDelivery.Outcome.PUBLISHED
    ).count()


def test_a_replay_in_a_quiet_database_goes_out_in_the_same_run(kafka_topic, log_relay):
    topic = kafka_topic()
    relay = log_relay()
    [event] = publish_events(topic, 1)
    assert relay.run().published == 1

    outbox_event_replay(event=OutboxEvent.objects.get(pk=event.id), new_event_id=False)
    # Nothing else is published: no event row commits after the replay.
    assert relay.run().published == 1

    assert _published_records(event.id) == 2


def test_a_replay_wakes_the_long_running_relay_in_a_quiet_database(
    kafka_topic, kafka_consumer_config, start_relay
):
    topic = kafka_topic()
    with transaction.atomic():
        event = outbox.publish(
            aggregate_type="order", aggregate_id="o-1", event_type="E", payload={}, topic=topic
        )
    # It polls once a minute: only a notification wakes it within the test.
    relay = start_relay("--poll-seconds", "60")
    wait_until(lambda: _published_records(event.id) == 1, timeout=30, message="the first send")
    time.sleep(0.5)  # the relay waits on its channel

    outbox_event_replay(event=OutboxEvent.objects.get(pk=event.id), new_event_id=False)
    wait_until(lambda: _published_records(event.id) == 2, timeout=10, message="the replay")

    assert relay.poll() is None
    messages = consume_all(kafka_consumer_config, topic, expected=2)
    assert [headers_of(m)["event_id"] for m in messages] == [str(event.id)] * 2


def test_a_relay_whose_session_lost_its_shard_locks_records_nothing(kafka_topic, log_relay, caplog):
    topic = kafka_topic()
    relay = log_relay()
    publish_events(topic, 2, keys=2)
    assert relay.run().published == 2
    # What DISCARD ALL does to the server session that a pooler in session mode hands to a
    # client's new connection: the same process id, no advisory lock. Another relay may take
    # the shards now.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock_all()")
    later = publish_events(topic, 2, keys=2, start=2)

    assert relay.run().published == 0

    assert sum(_published_records(event.id) for event in later) == 0
    assert "lost its shards" in caplog.text
    # The next run takes the shards again and sends the batch (again: copies, no loss).
    assert relay.run().published == 2


def test_a_topic_that_does_not_exist_holds_its_keys_and_the_other_topics_flow(
    kafka_topic, kafka_consumer_config, log_relay, settings
):
    missing = f"test.missing.{uuid.uuid4().hex[:10]}"
    present = kafka_topic()
    # A cluster that creates no topic on demand, as production's: the producer asks for none.
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_CONFIG": {
            **settings.OUTBOX.get("PRODUCER_CONFIG", {}),
            "allow.auto.create.topics": False,
            "topic.metadata.propagation.max.ms": 1000,
        },
    }
    relay = log_relay()
    assert relay.run().published == 0
    refused = publish_events(missing, 2, keys=1)
    # Alone in their span: nothing of it can go.
    assert relay.run(max_seconds=5).published == 0
    flowing = publish_events(present, 3, keys=3)

    deadline = time.monotonic() + 30
    published = 0
    while published < 3 and time.monotonic() < deadline:
        published += relay.run(max_seconds=5).published

    assert published == 3
    messages = consume_all(kafka_consumer_config, present, expected=3)
    assert sorted(headers_of(m)["event_id"] for m in messages) == sorted(str(e.id) for e in flowing)
    # The missing topic's key is held: its head failed once, with the cluster's answer, and
    # waits for its backoff; the event behind it waits behind it.
    held = list(OutboxHeldEvent.objects.order_by("position"))
    assert [h.event_id for h in held] == [e.id for e in refused]
    assert held[0].attempts == 1
    assert "UNKNOWN_TOPIC" in held[0].last_error, held[0].last_error


def test_a_record_the_broker_refuses_for_good_holds_its_key_and_the_others_flow(
    kafka_topic, kafka_consumer_config, log_relay, monkeypatch
):
    topic = kafka_topic(config={"max.message.bytes": "3000"})
    # The topic's limit could not be read (a principal that may not describe the topic): the
    # record goes to the broker, which refuses it, as it will every time.
    monkeypatch.setattr("outbox.relay.topic_record_limits", lambda topics: {})
    relay = log_relay()
    assert relay.run().published == 0
    with transaction.atomic():
        too_large = outbox.publish(
            aggregate_type="o",
            aggregate_id="a",
            event_type="E",
            # Random text: compressed, it stays over the limit.
            payload={"x": secrets.token_urlsafe(6000)},
            topic=topic,
        )
    # Alone in its span: nothing of the batch reaches Kafka.
    first = relay.run(max_seconds=5)
    flowing = publish_events(topic, 3, keys=3)

    second = relay.run(max_seconds=5)

    assert (first.published, first.failed) == (0, 1)
    assert second.published == 3
    head = OutboxHeldEvent.objects.get()
    assert (head.event_id, head.attempts) == (too_large.id, 1)
    assert head.last_error.startswith("MSG_SIZE_TOO_LARGE"), head.last_error
    messages = consume_all(kafka_consumer_config, topic, expected=3)
    assert sorted(headers_of(m)["event_id"] for m in messages) == sorted(str(e.id) for e in flowing)


def test_a_group_of_shards_whose_keys_are_quiet_records_where_it_got(
    kafka_topic, log_relay, monkeypatch
):
    topic = kafka_topic()
    quiet = tuple(range(SHARD_COUNT // 2, SHARD_COUNT))
    key = next(f"order-{n}" for n in range(100) if shard_of(f"order-{n}") not in quiet)
    relay = log_relay(shards=quiet)
    assert relay.run().published == 0
    [recorded] = cursors_read(shards=quiet)

    def publish_elsewhere() -> None:
        with transaction.atomic():
            outbox.publish(
                aggregate_type="order", aggregate_id=key, event_type="E", payload={}, topic=topic
            )

    # Events of other shards only: each run of this relay reads an empty span.
    publish_elsewhere()
    assert relay.run().published == 0
    # Within QUIET_CURSOR_RECORD_SECONDS of the recorded tick: nothing written.
    assert cursors_read(shards=quiet) == [recorded]

    monkeypatch.setattr("outbox.log_relay.QUIET_CURSOR_RECORD_SECONDS", 0.0)
    publish_elsewhere()
    assert relay.run().published == 0

    [moved] = cursors_read(shards=quiet)
    assert moved.tick_id > recorded.tick_id
    assert (moved.until_tick_id, moved.position) == (None, 0)


def test_a_kafka_transaction_whose_commit_timed_out_replaces_its_producer(
    kafka_topic, kafka_consumer_config, settings
):
    settings.OUTBOX = {**settings.OUTBOX, "RELAY_TRANSACTIONAL": True}
    transactional_id = transactional_id_for(f"commit-timeout-{uuid.uuid4().hex[:8]}")
    topic = kafka_topic()
    events = _as_log_events(publish_events(topic, 3, keys=3))
    stuck = get_producer(transactional_id=transactional_id)

    # A commit that cannot finish in its time: librdkafka goes on committing, and the abort
    # that follows cannot run meanwhile.
    reports, fatal = publish_batch_in_transaction(stuck, events, timeout=1e-6)

    assert not reports.delivered
    assert fatal
    assert stuck.fatal_error is not None
    # The relay asks for its producer again: a new one, whose initialisation finishes or
    # aborts what the old one left, and which sends the batch.
    fresh = get_producer(transactional_id=transactional_id)
    assert fresh is not stuck
    reports, fatal = publish_batch_in_transaction(fresh, events, timeout=30)
    assert not fatal
    assert {record.event_id for record in reports.delivered} == {event.id for event in events}
    messages = consume_all(kafka_consumer_config, topic, expected=3)  # read_committed
    assert len({headers_of(m)["event_id"] for m in messages}) == 3


def test_an_outage_spends_no_held_head_s_last_attempt(kafka_topic, log_relay, settings):
    topic = kafka_topic()
    # The producer refuses both keys' first event: two heads held, one attempt left each.
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_CONFIG": {"message.max.bytes": "4000"},
        "MAX_ATTEMPTS": 2,
    }
    with transaction.atomic():
        for key in ("a", "b"):
            outbox.publish(
                aggregate_type="o",
                aggregate_id=key,
                event_type="E",
                payload="x" * 5000,
                topic=topic,
            )
    relay = log_relay()
    assert relay.run().failed == 2
    # Then the cluster is unreachable, and both heads come due.
    settings.KAFKA_EVENTS = {**settings.KAFKA_EVENTS, "BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_CONFIG": {},
        "PRODUCER_DELIVERY_TIMEOUT_MS": 1000,
    }
    close_producers()
    OutboxHeldEvent.objects.update(next_attempt_at=timezone.now())

    step, _ = relay._step()

    # Both heads tried (in one send), both timed out.
    assert step.failed == 2
    tried = list(OutboxHeldEvent.objects.all())
    assert [head.last_error.split(":")[0] for head in tried] == ["_MSG_TIMED_OUT"] * 2
    # Counted, but an outage does not spend the last attempt: no operator needed for them.
    assert [head.attempts for head in tried] == [1, 1]
    assert all(head.next_attempt_at is not None for head in tried)
