"""Upgrading a database the claim relay of earlier versions was sending (migration 0012): what
it left in flight goes out once, in order per key; what it delivered or an operator discarded
is never sent again and reads as before."""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

import outbox
from outbox.log_relay import LogRelay
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.selectors import outbox_event_delivered
from outbox.services.repairs import outbox_event_retry
from outbox.services.retention import outbox_event_log_purge
from tests.outbox.conftest import assert_order_per_key, consume_all, headers_of

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

BEFORE = ("outbox", "0011_delivery_published_brin")
AFTER = ("outbox", "0012_claim_relay_removed")


def migrate(target: tuple[str, str] | None = None) -> None:
    """Migrates the outbox app to `target`, or to its latest migration."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target or executor.loader.graph.leaf_nodes("outbox")[0]])


@contextmanager
def outbox_migrated_to(target: tuple[str, str]) -> Iterator[None]:
    """The outbox app at migration `target`; afterwards emptied and migrated to its latest
    migration, so that migration 0014 gives the tests after it the layout of a new database
    (day partitions from today) rather than the partition of everything before tomorrow."""
    migrate(target)
    try:
        yield
    finally:
        with connection.cursor() as db:
            db.execute("TRUNCATE outbox_event, outbox_delivery, outbox_held_event")
        migrate()


@pytest.fixture
def claim_relay_schema():
    """The schema of the claim relay's last version, with the event log started as migration
    0009 starts it; the current schema again afterwards."""
    migrate(BEFORE)
    try:
        yield
    finally:
        if not migrated():
            with connection.cursor() as db:
                # What a test left leased must not stop the migration back.
                db.execute("UPDATE outbox_event SET locked_until = NULL")
        migrate()


def migrated() -> bool:
    return AFTER in MigrationExecutor(connection).recorder.applied_migrations()


def claim_row(topic: str, key: str, seq: int, *, before_0009: bool = False, **state) -> uuid.UUID:
    """An event row as the claim relay left it, committed in a transaction of its own."""
    now = timezone.now()
    row = {
        "status": "PENDING",
        "attempts": 0,
        "next_attempt_at": now,
        "last_error": "",
        "published_at": None,
        "kafka_partition": None,
        "kafka_offset": None,
        "discarded_at": None,
        "locked_until": None,
        "locked_by": "",
    } | state
    event_id = uuid.uuid4()
    with connection.cursor() as db:
        db.execute(
            f"""
            INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers,
                                      topic, key, created_at, updated_at, {", ".join(row)}
                                      {", txid" if before_0009 else ""})
            VALUES (%s, 'order', %s, 'E', %s::jsonb, '{{}}'::jsonb, %s, %s, %s, %s,
                    {", ".join(["%s"] * len(row))} {", NULL" if before_0009 else ""})
            """,
            [event_id, key, f'{{"seq": {seq}}}', topic, key, now, now, *list[Any](row.values())],
        )
    return event_id


def test_what_the_claim_relay_left_goes_out_once_in_order_and_what_it_delivered_stays_done(
    claim_relay_schema, kafka_topic, kafka_consumer_config, settings
):
    topic = kafka_topic(partitions=1)
    earlier = timezone.now() - timedelta(minutes=5)
    # Key A: one event from before the event log existed (no transaction id), one after.
    a1 = claim_row(topic, "A", 1, before_0009=True)
    a2 = claim_row(topic, "A", 2)
    # Key B: delivered by the claim relay.
    b1 = claim_row(
        topic,
        "B",
        1,
        status="DONE",
        attempts=1,
        published_at=earlier,
        kafka_partition=0,
        kafka_offset=41,
    )
    # Key C: a head backing off after two failures, one event waiting behind it.
    c1 = claim_row(
        topic, "C", 1, attempts=2, last_error="_MSG_TIMED_OUT: timed out", next_attempt_at=earlier
    )
    c2 = claim_row(topic, "C", 2)
    # Key D: a head whose attempts are spent (FAILED), one event waiting behind it.
    d1 = claim_row(topic, "D", 1, status="FAILED", attempts=10, last_error="MSG_SIZE_TOO_LARGE")
    d2 = claim_row(topic, "D", 2)
    # Key E: an operator discarded its FAILED head; the next event went out.
    e1 = claim_row(
        topic, "E", 1, status="FAILED", attempts=10, last_error="refused", discarded_at=earlier
    )
    e2 = claim_row(
        topic,
        "E",
        2,
        status="DONE",
        attempts=1,
        published_at=earlier,
        kafka_partition=0,
        kafka_offset=42,
    )
    # Key F: leased by a claim relay that died; the lease has run out.
    f1 = claim_row(topic, "F", 1, attempts=0, locked_until=earlier, locked_by="relay-that-died")

    migrate(AFTER)
    with connection.cursor() as db:
        db.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'outbox_event' AND column_name IN ('status', 'locked_until')"
        )
        assert db.fetchone()[0] == 0
    # The relay of this version reads the layout of the latest migration.
    migrate()
    # An event committed after the upgrade is read from the relay's new cursor.
    g1 = published_after_upgrade(topic, "G", 1)

    relay = LogRelay()
    try:
        relay.run()
        to_send = {a1, a2, c1, c2, f1, g1}
        messages = consume_all(kafka_consumer_config, topic, expected=len(to_send))
        sent = [uuid.UUID(headers_of(m)["event_id"]) for m in messages]
        assert sorted(sent) == sorted(to_send), "each in-flight event once, nothing else"
        assert_order_per_key(messages)

        b1_delivered = outbox_event_delivered(event_id=b1)
        assert b1_delivered.delivery_status == OutboxEvent.Status.DONE
        assert (b1_delivered.delivered_partition, b1_delivered.delivered_offset) == (0, 41)
        assert b1_delivered.delivered_at == earlier
        e1_delivered = outbox_event_delivered(event_id=e1)
        assert (e1_delivered.delivery_status, e1_delivered.delivery_discarded_at) == (
            OutboxEvent.Status.FAILED,
            earlier,
        )
        assert outbox_event_delivered(event_id=e2).delivery_status == OutboxEvent.Status.DONE
        c1_delivered = outbox_event_delivered(event_id=c1)
        # Its tries before the upgrade were a number on the row (2); the upgrade kept the
        # last one's error as a FAILED record, which with the try that went out makes 2.
        assert c1_delivered.delivery_status == OutboxEvent.Status.DONE
        assert c1_delivered.delivery_attempts == 2
        d1_delivered = outbox_event_delivered(event_id=d1)
        assert (d1_delivered.delivery_status, d1_delivered.delivery_attempts) == (
            OutboxEvent.Status.FAILED,
            10,
        )
        assert d1_delivered.delivery_error == "MSG_SIZE_TOO_LARGE"
        assert outbox_event_delivered(event_id=d2).delivery_status == OutboxEvent.Status.PENDING

        # The operator retries D's head: it goes, then the event behind it, in order.
        outbox_event_retry(event=OutboxEvent.objects.get(pk=d1))
        relay.run()
        messages = consume_all(kafka_consumer_config, topic, expected=len(to_send) + 2)
        assert [uuid.UUID(headers_of(m)["event_id"]) for m in messages][-2:] == [d1, d2]
        assert_order_per_key(messages)
        assert not OutboxHeldEvent.objects.exists()
    finally:
        relay.close()
    # Migration 0014 made the table the partition of everything before tomorrow. Once that
    # day is past, retention drops it: every event in it was delivered or discarded, those
    # written before the event log existed too.
    purged = outbox_event_log_purge(older_than=timezone.now() + timedelta(days=1), batch_size=4)
    assert (purged["events"], purged["partitions"]) == (11, 1)
    assert not OutboxEvent.objects.exists()


def published_after_upgrade(topic: str, key: str, seq: int) -> uuid.UUID:
    with transaction.atomic():
        return outbox.publish(
            aggregate_type="order",
            aggregate_id=key,
            event_type="E",
            payload={"seq": seq},
            topic=topic,
        ).id


def test_the_upgrade_refuses_while_a_claim_relay_holds_a_lease(claim_relay_schema):
    leased = claim_row(
        "orders",
        "A",
        1,
        locked_until=timezone.now() + timedelta(seconds=60),
        locked_by="relay-still-running",
    )

    with pytest.raises(Exception, match="holds events on lease until"):
        migrate(AFTER)

    with connection.cursor() as db:
        db.execute("SELECT locked_by FROM outbox_event WHERE id = %s", [leased])
        assert db.fetchone()[0] == "relay-still-running", "the refused upgrade changed nothing"
    assert not OutboxDelivery.objects.exists()


def test_a_database_the_claim_relay_never_sent_from_keeps_its_cursor(claim_relay_schema):
    with connection.cursor() as db:
        db.execute("SELECT count(*) FROM outbox_relay_cursor")
        cursors_before = db.fetchone()[0]
    untried = claim_row("orders", "A", 1)

    migrate(AFTER)

    with connection.cursor() as db:
        db.execute("SELECT count(*) FROM outbox_relay_cursor")
        assert db.fetchone()[0] == cursors_before
    assert not OutboxHeldEvent.objects.filter(event_id=untried).exists()
    assert outbox_event_delivered(event_id=untried).delivery_status == OutboxEvent.Status.PENDING
