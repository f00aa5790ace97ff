"""The day partitions of the event and delivery tables (migration 0014) and retention by
dropping them: a day goes whole once the relay is past it, held events stay, a publish in
flight is never dropped with its day."""

import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

import outbox
from outbox.conf import DEFAULTS
from outbox.errors import DuplicateEvent
from outbox.log_relay import LogRelay
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.selectors import outbox_event_delivered
from outbox.services.event_log.cursors import Cursor, cursors_read
from outbox.services.event_log.shards import ALL_SHARDS
from outbox.services.event_log.spans import batch_read
from outbox.services.event_log.ticks import tick_read, tick_take
from outbox.services.partitions import (
    DAYS_AHEAD,
    partition_create,
    partitions_read,
)
from outbox.services.retention import outbox_event_log_purge
from tests.conftest import connect_outside_django, publish_numbered
from tests.outbox.conftest import consume_all, headers_of, publish_events
from tests.outbox.test_claim_relay_migration import migrate, outbox_migrated_to

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

BEFORE_PARTITIONS = ("outbox", "0013_event_indexes_for_wal")


def partition_of(table: str, row_id: uuid.UUID) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {table} WHERE "
            + ("id" if table == "outbox_event" else "event_id")
            + " = %s",
            [row_id],
        )
        return cursor.fetchone()[0]


def today_partition(table: str) -> str:
    return f"{table}_p{datetime.now(UTC):%Y%m%d}"


def test_a_new_database_has_a_partition_for_today_and_the_days_ahead_and_a_default():
    for table in ("outbox_event", "outbox_delivery"):
        partitions = partitions_read(table=table)
        today = datetime.now(UTC).date()
        assert [partition.name for partition in partitions] == [
            f"{table}_p{today + timedelta(days=offset):%Y%m%d}" for offset in range(DAYS_AHEAD + 1)
        ] + [f"{table}_default"]
    [event] = publish_events("t", 1)
    assert partition_of("outbox_event", event.id) == today_partition("outbox_event")


def test_retention_drops_a_day_the_relay_is_past_and_keeps_its_held_event(
    kafka_topic, size_limited_log_relay
):
    topic = kafka_topic()
    held = publish_numbered(topic, "h", 0, too_large=True)
    sent = publish_events(topic, 4)
    assert size_limited_log_relay.run().published == 4
    assert OutboxHeldEvent.objects.get().event_id == held.id

    # The day of the events is over (retention runs a day later).
    purged = outbox_event_log_purge(older_than=timezone.now() + timedelta(days=1), batch_size=10)

    assert (purged["events"], purged["partitions"]) == (4, 1)
    # The held event was moved out of the partition before it went (into the DEFAULT
    # partition, and from there into today's partition, which retention created again).
    assert list(OutboxEvent.objects.values_list("pk", flat=True)) == [held.id]
    assert partition_of("outbox_event", held.id) == today_partition("outbox_event")
    # The delivery records stay a day longer than their events.
    assert OutboxDelivery.objects.filter(event_id__in=[e.id for e in sent]).count() == 4

    # Two days on, the event partitions of those days are gone, so the delivery records of
    # the day go too, but for the held event's, which are moved out first.
    purged = outbox_event_log_purge(older_than=timezone.now() + timedelta(days=3), batch_size=10)

    assert purged["deliveries"] == 4
    assert not OutboxDelivery.objects.filter(event_id__in=[e.id for e in sent]).exists()
    assert OutboxDelivery.objects.get(event_id=held.id).outcome == OutboxDelivery.Outcome.FAILED

    # The relay goes on into the partitions created again.
    more = publish_events(topic, 2)
    assert size_limited_log_relay.run().published == 2
    assert partition_of("outbox_event", more[0].id) == today_partition("outbox_event")


def test_retention_leaves_a_day_the_relay_is_not_past(kafka_topic):
    events = publish_events(kafka_topic(), 3)

    purged = outbox_event_log_purge(older_than=timezone.now() + timedelta(days=1), batch_size=10)

    assert (purged["events"], purged["partitions"]) == (0, 0)
    assert OutboxEvent.objects.count() == len(events)


def test_a_publish_committing_while_the_drop_waits_for_its_lock_keeps_its_day(
    kafka_topic, log_relay, settings, caplog
):
    topic = kafka_topic()
    publish_events(topic, 2)
    relay = log_relay()
    assert relay.run().published == 2
    in_flight = uuid.uuid4()
    other = connect_outside_django(connection.settings_dict)
    other.execute(
        """
        INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers,
                                  topic, key, created_at)
        VALUES (%s, 'o', 'k', 'E', '{}', '{}', %s, 'k', now())
        """,
        [in_flight, topic],
    )
    # Retention's checks see the two delivered events only; the drop then waits for the
    # lock the uncommitted insert holds, and gets it once that commits.
    settings.OUTBOX = {**settings.OUTBOX, "PARTITION_LOCK_TIMEOUT_MS": 10_000}
    committer = threading.Timer(1.0, other.commit)
    committer.start()
    try:
        with caplog.at_level(logging.INFO, logger="outbox.services.retention"):
            purged = outbox_event_log_purge(
                older_than=timezone.now() + timedelta(days=1), batch_size=10
            )
    finally:
        committer.join()
        other.close()
    assert purged["partitions"] == 0
    assert OutboxEvent.objects.filter(pk=in_flight).exists()
    assert "dropped" not in caplog.text

    # With a short timeout a lock that does not come leaves the day for the next run.
    other = connect_outside_django(connection.settings_dict)
    other.execute("LOCK TABLE outbox_event IN ACCESS SHARE MODE")
    settings.OUTBOX = {**settings.OUTBOX, "PARTITION_LOCK_TIMEOUT_MS": 100}
    try:
        assert relay.run().published == 1
        purged = outbox_event_log_purge(
            older_than=timezone.now() + timedelta(days=1), batch_size=10
        )
    finally:
        other.close()
    assert purged["partitions"] == 0
    assert "left a partition for the next run" in caplog.text
    assert OutboxEvent.objects.count() == 3

    purged = outbox_event_log_purge(older_than=timezone.now() + timedelta(days=1), batch_size=10)
    assert (purged["events"], purged["partitions"]) == (3, 1)


def test_a_new_partition_takes_its_rows_from_the_default_partition():
    day = datetime.now(UTC).date() + timedelta(days=DAYS_AHEAD + 3)
    stray = OutboxEvent.objects.create(
        aggregate_type="o",
        aggregate_id="k",
        event_type="E",
        payload={},
        topic="t",
        key="k",
        created_at=datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(hours=5),
    )
    assert partition_of("outbox_event", stray.pk) == "outbox_event_default"

    name = partition_create(table="outbox_event", day=day)
    try:
        assert partition_of("outbox_event", stray.pk) == name
        assert OutboxEvent.objects.get(pk=stray.pk).created_at == stray.created_at
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {name}")


def test_a_given_event_id_is_used_once_across_transactions_and_partitions():
    event_id = uuid.uuid4()
    event = {"aggregate_type": "o", "aggregate_id": "k", "event_type": "E", "payload": {}}
    with transaction.atomic():
        outbox.publish(**event, event_id=event_id)
    with transaction.atomic(), pytest.raises(DuplicateEvent):
        outbox.publish(**event, event_id=event_id)
    # An event made by other means than publish() (the ORM, whose default draws a
    # time-ordered id) is found among the events of its id's time.
    older = OutboxEvent.objects.create(**event, topic="t", key="k")
    with transaction.atomic(), pytest.raises(DuplicateEvent):
        outbox.publish(**event, event_id=older.pk)
    assert OutboxEvent.objects.count() == 2


@pytest.fixture
def schema_before_partitions():
    with outbox_migrated_to(BEFORE_PARTITIONS):
        yield


def test_an_upgrade_with_events_in_flight_loses_and_repeats_nothing(
    schema_before_partitions, kafka_topic, kafka_consumer_config, size_limited_log_relay
):
    topic = kafka_topic()
    sent = publish_events(topic, 3)
    # The relay of this version writes each try's duration (migration 0018), a column this
    # schema lacks: it stands in for the relay of the time with the column added for its run
    # and dropped before the upgrade, which leaves the rows that relay wrote.
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE outbox_delivery ADD COLUMN duration_ms integer")
    assert size_limited_log_relay.run().published == 3
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE outbox_delivery DROP COLUMN duration_ms")
    # Written before the upgrade and read after it: the relay of this version holds the
    # event in the layout of migration 0015 (its held rows are tested with that migration).
    held = publish_numbered(topic, "h", 0, too_large=True)
    pending = publish_events(topic, 2, start=3)
    size_limited_log_relay.close()

    migrate()

    oldest = partitions_read(table="outbox_event")[0]
    assert (oldest.name, oldest.lower) == ("outbox_event_before_partitioning", None)
    assert {partition_of("outbox_event", e.id) for e in [held, *sent, *pending]} == {
        "outbox_event_before_partitioning"
    }
    relay = LogRelay()
    try:
        assert relay.run().published == 2
    finally:
        relay.close()
    messages = consume_all(kafka_consumer_config, topic, expected=5)
    assert sorted(headers_of(m)["event_id"] for m in messages) == sorted(
        str(e.id) for e in [*sent, *pending]
    )
    assert OutboxHeldEvent.objects.get().event_id == held.id
    assert outbox_event_delivered(event_id=pending[1].id).delivery_status == "DONE"
    # An id recorded before the upgrade is still used once.
    with transaction.atomic(), pytest.raises(DuplicateEvent):
        outbox.publish(
            aggregate_type="o", aggregate_id="k", event_type="E", payload={}, event_id=sent[0].id
        )


def index_tuples_fetched(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            """
            SELECT coalesce(sum(idx_tup_fetch), 0) FROM pg_stat_user_tables
            WHERE relid IN (SELECT relid FROM pg_partition_tree(%s::regclass))
            """,
            [table],
        )
        return int(cursor.fetchone()[0])


def test_a_batch_of_a_large_span_reads_no_more_events_than_it_returns():
    """A span larger than a batch is listed in position order once (the relay's session table);
    each later batch reads from the event table only the events it returns, through the
    (txid, position) index of the partition of each one's day, however large the span."""
    [start] = cursors_read(shards=ALL_SHARDS)
    since = tick_read(tick_id=start.tick_id)
    publish_events("t", 5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE outbox_event")  # as autovacuum does after such an insert
    until = tick_take(after=since)
    assert until is not None
    first, first_done = batch_read(
        cursor=start, since=since, until=until, limit=10, max_bytes=DEFAULTS["BATCH_MAX_BYTES"]
    )
    # The next batch starts inside the span, after the first batch's last event.
    inside = Cursor(
        shards=ALL_SHARDS,
        tick_id=since.id,
        until_tick_id=until.id,
        position=first[-1].position,
    )
    before = index_tuples_fetched("outbox_event")

    second, second_done = batch_read(
        cursor=inside, since=since, until=until, limit=10, max_bytes=DEFAULTS["BATCH_MAX_BYTES"]
    )

    assert not first_done
    assert not second_done
    assert len(second) == 10
    assert [event.position for event in first + second] == sorted(
        event.position for event in first + second
    )
    assert second[0].position > first[-1].position
    assert index_tuples_fetched("outbox_event") - before <= 10 * 2
