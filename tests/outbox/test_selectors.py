from collections import Counter
from collections.abc import Sequence
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

import outbox
from outbox.ids import time_ordered_event_id
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.selectors import (
    outbox_events_with_delivery,
    outbox_last_published_at,
    outbox_log_backlog,
    outbox_log_done_count,
    outbox_oldest_pending_age_seconds,
    outbox_quarantined_keys,
)
from outbox.services.event_log.shards import ALL_SHARDS, shard_of
from outbox.services.partitions import partition_create
from tests.conftest import connect_outside_django, event_row_place
from tests.outbox.conftest import event_rows_read, publish_events

pytestmark = pytest.mark.django_db


def _event(key: str) -> OutboxEvent:
    with transaction.atomic():
        return outbox.publish(aggregate_type="o", aggregate_id=key, event_type="E", payload={})


def test_the_delivery_of_an_event_reads_from_its_records_and_the_held_set():
    now = timezone.now()
    discarded = _event("log-discarded")
    OutboxDelivery.objects.create(
        event_id=discarded.id, outcome="DISCARDED", published_at=now, error="", relay="r"
    )
    by_log_relay = _event("log-done")
    OutboxDelivery.objects.create(
        event_id=by_log_relay.id, outcome="FAILED", published_at=now, error="timeout", relay="r"
    )
    OutboxDelivery.objects.create(
        event_id=by_log_relay.id,
        outcome="PUBLISHED",
        published_at=now,
        kafka_partition=2,
        kafka_offset=9,
        relay="r",
    )
    spent, retrying = _event("log-spent"), _event("log-retrying")
    for event, next_attempt_at in ((spent, None), (retrying, now)):
        OutboxHeldEvent.objects.create(
            event_id=event.id,
            shard=0,
            topic=event.topic,
            key=event.key,
            transaction_id=1,
            position=event.position,
            **event_row_place(event),
            attempts=3,
            next_attempt_at=next_attempt_at,
        )
    _event("waiting")

    rows = {
        row.key: (
            row.delivery_status,
            row.delivered_at,
            row.delivered_partition,
            row.delivered_offset,
        )
        for row in outbox_events_with_delivery(OutboxEvent.objects.all())
    }

    assert rows == {
        "log-discarded": ("FAILED", None, None, None),
        "log-done": ("DONE", now, 2, 9),
        "log-spent": ("FAILED", None, None, None),
        "log-retrying": ("PENDING", None, None, None),
        "waiting": ("PENDING", None, None, None),
    }


# --- the event-log relay's backlog, held keys and last publication ---------------------------
# The relay's cursors and ticks are written here as it writes them. Every event of a test is
# written by the test's one transaction (txid T); an event the relay's cursor has passed is
# given the id of an earlier transaction, one its tick's snapshot sees.

TOO_BIG = "MSG_SIZE_TOO_LARGE: Broker: Message too large"
TIMED_OUT = "MSG_TIMED_OUT: Local: Message timed out"


def current_txid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text")
        return int(cursor.fetchone()[0])


def cursor_at(
    *,
    visible_below: int = 0,
    snapshot: str | None = None,
    tick_id: int | None = None,
    shards: Sequence[int] = ALL_SHARDS,
) -> int:
    """Appends a cursor of `shards` at tick `tick_id`, or at a new tick of `snapshot`, or of
    one that sees every transaction before `visible_below` and none from it on; returns the
    tick's id."""
    with connection.cursor() as cursor:
        if tick_id is None:
            cursor.execute(
                "INSERT INTO outbox_tick (snapshot) VALUES (%s::pg_snapshot) RETURNING id",
                [snapshot or f"{visible_below}:{visible_below}:"],
            )
            tick_id = cursor.fetchone()[0]
        cursor.execute(
            """
            INSERT INTO outbox_relay_cursor (shards, tick_id, txid, position, relay)
            VALUES (%s::smallint[], %s, '0'::xid8, 0, 'test')
            """,
            [list(shards), tick_id],
        )
    return tick_id


def log_event(key: str, *, age: timedelta, txid: int | None = None) -> OutboxEvent:
    # Created `age` ago, with the id publish() would have drawn then (outbox.ids).
    created_at = timezone.now() - age
    backdated_id = time_ordered_event_id(created_at)
    OutboxEvent.objects.filter(pk=_event(key).pk).update(id=backdated_id, created_at=created_at)
    event = OutboxEvent.objects.get(pk=backdated_id)
    if txid is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE outbox_event SET txid = %s::xid8 WHERE id = %s", [str(txid), event.pk]
            )
    event.refresh_from_db()
    return event


def record(event: OutboxEvent, outcome: str, *, at=None, error: str = "") -> OutboxDelivery:
    return OutboxDelivery.objects.create(
        event_id=event.pk,
        outcome=outcome,
        published_at=at or timezone.now(),
        error=error,
        relay="test",
    )


def hold(
    event: OutboxEvent, *, txid: int, attempts: int = 0, next_attempt_at=None, error: str = ""
) -> OutboxHeldEvent:
    return OutboxHeldEvent.objects.create(
        event_id=event.pk,
        shard=shard_of(event.key),
        topic=event.topic,
        key=event.key,
        transaction_id=txid,
        position=event.position,
        **event_row_place(event),
        attempts=attempts,
        next_attempt_at=next_attempt_at,
        last_error=error,
    )


def log_relay_mix() -> dict[str, OutboxEvent]:
    """Events in every state the event-log relay leaves them in, before and after its cursor:
    4 DONE, 1 FAILED, 8 PENDING (the oldest created 15 minutes ago) and 3 discarded."""
    now = timezone.now()
    later = current_txid()
    earlier, running = later - 1, later - 2
    # The cursor's tick saw `earlier` committed, `running` still running, `later` not begun.
    cursor_at(snapshot=f"{running}:{later}:{running}")
    minutes = lambda n: timedelta(minutes=n)  # noqa: E731
    events = {
        # Read before the cursor's tick and sent.
        "delivered": log_event("delivered", age=minutes(30), txid=earlier),
        # Read after it (the cursor's span not finished yet), failed once, then sent.
        "delivered-late": log_event("delivered-late", age=minutes(25)),
        # A head whose attempts are spent, and an event of its key queued behind it.
        "spent": log_event("spent", age=minutes(40), txid=earlier),
        "behind-spent": log_event("spent", age=minutes(15), txid=earlier),
        # A head backing off, and one queued behind it, read after the cursor.
        "backing-off": log_event("backing-off", age=minutes(12), txid=earlier),
        "behind-backing-off": log_event("backing-off", age=minutes(11)),
        # Given up by an operator (read after the cursor); one given up after a replay of
        # it failed; and one replayed after it was given up, then sent.
        "discarded": log_event("discarded", age=minutes(50)),
        "replay-discarded": log_event("replay-discarded", age=minutes(300), txid=earlier),
        "discarded-replayed": log_event("discarded-replayed", age=minutes(260), txid=earlier),
        # Sent, then replayed by an operator: held again, as the last of its key.
        "replayed": log_event("replayed", age=minutes(8), txid=earlier),
        # Not read yet: after the cursor, no record.
        "unsent": log_event("unsent", age=minutes(5)),
        "unsent-too": log_event("unsent-too", age=minutes(4)),
        # Tried while Kafka was unreachable: a FAILED record, not held, read again later.
        "outage": log_event("outage", age=minutes(3)),
        # Committed after the tick by a transaction that began before it: not read yet.
        "committed-late": log_event("committed-late", age=minutes(6), txid=running),
        # Delivered, and given up on, by the claim relay of an earlier version: migration
        # 0012 wrote one record of each outcome.
        "by-claim-relay": log_event("by-claim-relay", age=minutes(60), txid=earlier),
        "discarded-by-claim-relay": log_event("discarded-claim", age=minutes(70), txid=earlier),
    }
    record(events["delivered"], "PUBLISHED", at=now - minutes(20))
    record(events["delivered-late"], "FAILED", at=now - minutes(2), error=TIMED_OUT)
    record(events["delivered-late"], "PUBLISHED", at=now - minutes(1))
    record(events["spent"], "FAILED", at=now - minutes(39), error=TIMED_OUT)
    record(events["spent"], "FAILED", at=now - minutes(38), error=TOO_BIG)
    hold(events["spent"], txid=earlier, attempts=2, error=TOO_BIG)
    hold(events["behind-spent"], txid=earlier)
    record(events["backing-off"], "FAILED", at=now - minutes(11), error=TIMED_OUT)
    hold(
        events["backing-off"],
        txid=earlier,
        attempts=1,
        next_attempt_at=now + minutes(5),
        error=TIMED_OUT,
    )
    hold(events["behind-backing-off"], txid=later)
    record(events["discarded"], "FAILED", at=now - minutes(49), error=TOO_BIG)
    record(events["discarded"], "DISCARDED", at=now - minutes(48))
    record(events["replay-discarded"], "PUBLISHED", at=now - minutes(299))
    record(events["replay-discarded"], "FAILED", at=now - minutes(200), error=TOO_BIG)
    record(events["replay-discarded"], "DISCARDED", at=now - minutes(199))
    record(events["discarded-replayed"], "FAILED", at=now - minutes(259), error=TOO_BIG)
    record(events["discarded-replayed"], "DISCARDED", at=now - minutes(258))
    record(events["discarded-replayed"], "PUBLISHED", at=now - minutes(250))
    record(events["replayed"], "PUBLISHED", at=now - minutes(7))
    hold(events["replayed"], txid=later)
    record(events["outage"], "FAILED", at=now - minutes(2), error="_TRANSPORT: Broker down")
    record(events["by-claim-relay"], "PUBLISHED", at=now - minutes(10))
    record(events["discarded-by-claim-relay"], "DISCARDED", at=now - minutes(65), error=TOO_BIG)
    return events


def test_the_backlog_counts_what_is_left_after_the_cursors():
    log_relay_mix()

    backlog = outbox_log_backlog()

    # Unsent: unsent, unsent-too, outage, committed-late. Held and waiting: behind-spent,
    # backing-off, behind-backing-off, replayed. Spent: spent.
    assert (backlog.unsent, backlog.held_waiting, backlog.held_spent) == (4, 4, 1)
    age = (timezone.now() - backlog.oldest_pending_created_at).total_seconds()
    assert 15 * 60 <= age < 15 * 60 + 30  # behind-spent; the spent head is not pending
    # delivered, delivered-late, by-claim-relay, discarded-replayed
    assert outbox_log_done_count() == 4
    assert 15 * 60 <= outbox_oldest_pending_age_seconds() < 15 * 60 + 30
    # The same as each event's own status says.
    statuses = Counter(
        outbox_events_with_delivery(OutboxEvent.objects.all())
        .filter(delivery_discarded_at__isnull=True)
        .values_list("delivery_status", flat=True)
    )
    assert statuses == {"PENDING": 8, "FAILED": 1, "DONE": 4}


def test_the_oldest_current_cursor_bounds_what_is_unsent():
    later = current_txid()
    before = cursor_at(visible_below=later)
    lagging = log_event("lagging", age=timedelta(minutes=3))
    sent = log_event("sent", age=timedelta(minutes=2))
    record(sent, "PUBLISHED")
    assert outbox_log_backlog().unsent == 1
    assert outbox_oldest_pending_age_seconds() == pytest.approx(180, abs=30)

    # Every shard's latest cursor has passed both: nothing is left.
    cursor_at(visible_below=later + 1)
    assert outbox_log_backlog().unsent == 0
    assert outbox_oldest_pending_age_seconds() is None

    # The shard of the lagging event falls behind (its latest cursor row is an old one):
    # the oldest cursor is where the search starts, and what the others sent is left out.
    cursor_at(tick_id=before, shards=[shard_of(lagging.key)])
    assert outbox_log_backlog().unsent == 1


@pytest.mark.django_db(transaction=True)
def test_a_writer_idle_in_its_transaction_does_not_make_the_backlog_walk_what_was_sent(
    without_sequential_scans,
):
    with connect_outside_django(connection.settings_dict) as writer:
        # A transaction id held, the session idle: every snapshot's xmin stays at it.
        writer.execute("SELECT pg_current_xact_id()")
        for start in range(0, 3000, 1000):
            publish_events("orders", 1000, start=start)
        # The relay's cursor after the 3,000: its snapshot sees them, not the writer.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_snapshot()::text")
            snapshot = cursor.fetchone()[0]
        cursor_at(snapshot=snapshot)
        publish_events("orders", 1, start=3000)
        before = event_rows_read()

        backlog = outbox_log_backlog()

        entries = event_rows_read() - before
        writer.rollback()
    assert int(snapshot.split(":")[0]) < int(snapshot.split(":")[1])  # the writer in its xip
    assert backlog.unsent == 1
    # The count finds the one new event without walking the 3,000 committed since the
    # writer's transaction began (a read from the snapshot's xmin walks them all).
    assert entries <= 20, entries


def test_quarantined_keys_are_the_held_keys_with_their_heads():
    events = log_relay_mix()

    keys = outbox_quarantined_keys()

    assert [
        (
            k.key,
            k.blocking_event_id,
            k.blocking_status,
            k.blocking_attempts,
            k.blocking_error,
            k.waiting_events,
        )
        for k in keys
    ] == [
        # Waiting for an operator first, then the next due.
        ("spent", str(events["spent"].id), "FAILED", 2, TOO_BIG, 1),
        ("replayed", str(events["replayed"].id), "PENDING", 0, "", 0),
        ("backing-off", str(events["backing-off"].id), "PENDING", 1, TIMED_OUT, 1),
    ]
    assert keys[0].blocking_next_attempt_at is None
    assert keys[2].blocking_next_attempt_at > timezone.now()
    assert [k.key for k in outbox_quarantined_keys(limit=1)] == ["spent"]


def test_the_last_publication_is_the_latest_published_record():
    assert outbox_last_published_at() is None
    first, second, third = _event("a"), _event("b"), _event("c")
    now = timezone.now()
    # Found beyond the first windows it looks through (a minute, an hour).
    record(third, "PUBLISHED", at=now - timedelta(hours=5))
    assert outbox_last_published_at() == now - timedelta(hours=5)
    record(first, "PUBLISHED", at=now - timedelta(seconds=30))
    record(second, "FAILED", at=now)
    record(second, "DISCARDED", at=now)
    assert outbox_last_published_at() == now - timedelta(seconds=30)


def test_the_delivery_of_an_event_is_read_from_the_partitions_of_its_time_on():
    """The delivery table is partitioned by day on published_at, and no record is dated before
    its event: each of an event's per-row reads probes the partitions from the event's
    creation on (less RECORD_CLOCK_MARGIN), not those of every day retention keeps."""
    today = timezone.now().date()
    # Two and three days back: beyond the margin even just after midnight.
    older = [
        partition_create(table="outbox_delivery", day=today - timedelta(days=days))
        for days in (2, 3)
    ]
    event = _event("recent")
    OutboxDelivery.objects.create(
        event_id=event.id, outcome="PUBLISHED", published_at=timezone.now(), relay="r"
    )

    plan = outbox_events_with_delivery(OutboxEvent.objects.filter(pk=event.pk)).explain(
        analyze=True
    )

    def scans_of(partition: str) -> list[str]:
        return [line for line in plan.splitlines() if f" on {partition} " in line]

    assert any("actual time" in line for line in scans_of(f"outbox_delivery_p{today:%Y%m%d}"))
    # Pruned as the plan ran (or before): never scanned.
    assert [line for name in older for line in scans_of(name) if "never executed" not in line] == []
