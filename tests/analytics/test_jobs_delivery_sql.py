"""The job's SQL reading of an event's delivery, without Spark: the queries the job sends over
JDBC, run by the test's own connection. Each kind of history the relay leaves gives the
status and placement of outbox.selectors.outbox_events_with_delivery and the attempts of the
event's latest delivery; every PENDING event is found without its delivery records; a
partitioned read's range of created_at reaches the index."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from analytics import jobs
from outbox.models import OutboxDelivery, OutboxEvent
from outbox.selectors import outbox_events_with_delivery
from outbox.services.event_log.shards import ALL_SHARDS
from tests.analytics.factories import CLAIM_RELAY_HANDED_OVER, delivery_record, held_event

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
SINCE = T0 - timedelta(hours=1)
UNTIL = T0 + timedelta(hours=1)
PUBLISHED = OutboxDelivery.Outcome.PUBLISHED
DISCARDED = OutboxDelivery.Outcome.DISCARDED
FAILED = OutboxDelivery.Outcome.FAILED
# When a held head waiting for its retry is due.
LATER = datetime.now(tz=UTC) + timedelta(hours=1)


@dataclass(frozen=True)
class Case:
    """An event's delivery records (outcome, seconds after creation, partition, offset) in
    order, its held row (attempts, next attempt due), and what the job reads. Its row is as
    publish() wrote it: the relay never updates it."""

    records: Sequence[tuple[str, int, int | None, int | None]] = ()
    held: tuple[int, datetime | None] | None = None
    status: str = OutboxEvent.Status.DONE
    attempts: int = 1
    # The records' relay; None: the relay's own name (the operator's for a discard).
    relay: str | None = None


CASES = {
    "not yet sent": Case(status="PENDING", attempts=0),
    "published": Case(records=[(PUBLISHED, 1, 1, 7)]),
    "retried, then published": Case(
        records=[(FAILED, 1, None, None), (FAILED, 2, None, None), (PUBLISHED, 3, 0, 9)],
        attempts=3,
    ),
    "queued behind its key's head": Case(held=(0, None), status="PENDING", attempts=0),
    "waiting for its retry": Case(
        records=[(FAILED, 1, None, None)] * 2, held=(2, LATER), status="PENDING", attempts=2
    ),
    "attempts spent": Case(
        records=[(FAILED, 1, None, None)] * 3, held=(3, None), status="FAILED", attempts=3
    ),
    "discarded": Case(
        records=[(FAILED, 1, None, None)] * 2 + [(DISCARDED, 60, None, None)],
        status="FAILED",
        attempts=2,
    ),
    "replayed": Case(records=[(PUBLISHED, 1, 0, 3), (PUBLISHED, 600, 1, 40)]),
    "replayed, waiting for its turn": Case(
        records=[(PUBLISHED, 1, 0, 3)], held=(0, None), status="PENDING", attempts=0
    ),
    "replayed, failing": Case(
        records=[(PUBLISHED, 1, 0, 3), (FAILED, 600, None, None)],
        held=(1, LATER),
        status="PENDING",
        attempts=1,
    ),
    "discarded, replayed": Case(
        records=[(FAILED, 1, None, None), (DISCARDED, 60, None, None), (PUBLISHED, 600, 1, 2)],
    ),
    # An operator's retry of a spent event leaves no record: the tries before it count too.
    "spent, retried by an operator, published": Case(
        records=[(FAILED, 1, None, None)] * 3 + [(PUBLISHED, 900, 0, 8)], attempts=4
    ),
    # What the claim relay left, as migration 0012 handed it over (records under its name):
    # published; tried and still failing (its last error as one FAILED record, held with the
    # attempts it had counted); spent, then discarded by an operator.
    "handed over: published by the claim relay": Case(
        records=[(PUBLISHED, 1, 0, 1)], relay=CLAIM_RELAY_HANDED_OVER
    ),
    "handed over: tried, waiting for its retry": Case(
        records=[(FAILED, 1, None, None)],
        held=(4, LATER),
        status="PENDING",
        attempts=4,
        relay=CLAIM_RELAY_HANDED_OVER,
    ),
    "handed over: attempts spent": Case(
        records=[(FAILED, 1, None, None)],
        held=(5, None),
        status="FAILED",
        attempts=5,
        relay=CLAIM_RELAY_HANDED_OVER,
    ),
}


def _event(name: str, case: Case, created: datetime) -> OutboxEvent:
    event = OutboxEvent.objects.create(
        aggregate_type="orders",
        aggregate_id=name,
        event_type="order.created",
        payload={},
        topic="orders",
        key=name,
        created_at=created,
    )
    for outcome, seconds, partition, offset in case.records:
        delivery_record(
            event_id=event.id,
            outcome=outcome,
            at=created + timedelta(seconds=seconds),
            partition=partition,
            offset=offset,
            relay=case.relay,
        ).save()
    if case.held is not None:
        attempts, next_attempt_at = case.held
        held_event(event=event, attempts=attempts, next_attempt_at=next_attempt_at).save()
    return event


def _captured_query(read: Any) -> str:
    """The query a read of the job hands to the partitioned JDBC read."""
    captured: list[str] = []

    def jdbc_read(spark: Any, config: jobs.JobConfig, *, query: str, **kwargs: Any) -> None:
        captured.append(query)

    config = jobs.JobConfig(
        since=SINCE,
        until=UNTIL,
        as_of=T0 + timedelta(days=1),
        source=jobs.JdbcSource(host="unused", port=5432, database="unused", user="", password=""),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jobs, "_jdbc_read", jdbc_read)
        read(None, config)
    (query,) = captured
    return query


def test_the_job_reads_each_event_as_the_selector_shows_it() -> None:
    created = {name: T0 + timedelta(seconds=index) for index, name in enumerate(CASES)}
    events = {name: _event(name, case, created[name]) for name, case in CASES.items()}
    names = {str(event.id): name for name, event in events.items()}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT event_id, status, attempts, published_at, kafka_partition, kafka_offset, "
            f"due, stuck FROM ({_captured_query(jobs.read_outbox)}) AS source"
        )
        read = {names[row[0]]: row[1:] for row in cursor.fetchall()}
    shown = {
        names[str(event.pk)]: event
        for event in outbox_events_with_delivery(OutboxEvent.objects.all())
    }
    assert set(read) == set(CASES)
    for name, case in CASES.items():
        status, attempts, published_at, partition, offset, due, stuck = read[name]
        event = shown[name]
        assert (status, attempts) == (case.status, case.attempts), name
        assert status == event.delivery_status, name
        assert (published_at, partition, offset) == (
            event.delivered_at,
            event.delivered_partition,
            event.delivered_offset,
        ), name
        assert due == int(status == "DONE"), name
        assert stuck == int(status == "PENDING"), name
    # The latest publication of a replayed event, not the first.
    assert read["replayed"][2:5] == (created["replayed"] + timedelta(seconds=600), 1, 40)


def _maybe_pending(names: dict[str, str]) -> dict[str, tuple[bool, str]]:
    """Each event's maybe_pending and status, as the job's derived table gives them."""
    config = jobs.JobConfig(
        since=SINCE,
        until=UNTIL,
        as_of=T0 + timedelta(days=1),
        source=jobs.JdbcSource(host="unused", port=5432, database="unused", user="", password=""),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT o.id::text, o.maybe_pending, o.status FROM {jobs._outbox_sql(config)} AS o"
        )
        return {names[row[0]]: (row[1], row[2]) for row in cursor.fetchall()}


def test_every_pending_event_is_maybe_pending_without_cursors() -> None:
    """With no cursor recorded (or none past the events), nothing is known to be sent: every
    event is a candidate, and the delivery records decide."""
    created = {name: T0 + timedelta(seconds=index) for index, name in enumerate(CASES)}
    events = {name: _event(name, case, created[name]) for name, case in CASES.items()}
    names = {str(event.id): name for name, event in events.items()}
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM outbox_relay_cursor")
    read = _maybe_pending(names)
    assert set(read) == set(CASES)
    for name, case in CASES.items():
        assert read[name] == (True, case.status), name


@pytest.mark.django_db(transaction=True)
def test_maybe_pending_spares_the_events_the_cursors_have_passed() -> None:
    """The stuck read filters on maybe_pending before it reads any delivery record: an event
    the relay's cursors have passed, not held, is delivered or discarded, and is spared; a
    held one, or one committed after the cursors, is read."""
    # The relay has read every event the cursors have passed: each has an outcome, or is held.
    passed = {name: case for name, case in CASES.items() if case.records or case.held}
    created = {name: T0 + timedelta(seconds=index) for index, name in enumerate(passed)}
    events = {name: _event(name, case, created[name]) for name, case in passed.items()}
    with connection.cursor() as cursor:
        # A tick whose snapshot sees every event committed so far (its xmin past the last
        # one's transaction: other sessions of the server could hold a taken snapshot's
        # back), and every shard's cursor on it, as the relay leaves them after a batch.
        cursor.execute("SELECT max(txid)::text::bigint + 1 FROM outbox_event")
        xmin = cursor.fetchone()[0]
        cursor.execute(
            "INSERT INTO outbox_tick (snapshot) VALUES (%s::pg_snapshot) RETURNING id",
            [f"{xmin}:{xmin}:"],
        )
        tick_id = cursor.fetchone()[0]
        cursor.execute(
            """
            INSERT INTO outbox_relay_cursor (shards, tick_id, txid, position, relay)
            VALUES (%s::smallint[], %s, '0'::xid8, 0, 'analytics-test')
            """,
            [list(ALL_SHARDS), tick_id],
        )
    late = "not yet sent, after the cursors"
    events[late] = _event(late, CASES["not yet sent"], T0 + timedelta(minutes=30))
    names = {str(event.id): name for name, event in events.items()}
    read = _maybe_pending(names)
    assert set(read) == {*passed, late}
    assert read[late] == (True, "PENDING")
    for name, case in passed.items():
        maybe_pending, status = read[name]
        assert status == case.status, name
        assert maybe_pending == (case.held is not None), name


def _created_at_indexes() -> set[str]:
    """outbox_event's created_at index: on each partition, its own part."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relid::regclass::text FROM pg_partition_tree('outbox_event_created_brin')"
        )
        return {row[0] for row in cursor.fetchall()}


def _index_conditions(plan: Any, indexes: set[str]) -> list[str]:
    """The index conditions of the plan's scans of `indexes`."""
    found = []
    if isinstance(plan, dict):
        if plan.get("Index Name") in indexes:
            found.append(plan.get("Index Cond", ""))
        for value in plan.values():
            found += _index_conditions(value, indexes)
    elif isinstance(plan, list):
        for value in plan:
            found += _index_conditions(value, indexes)
    return found


@pytest.mark.parametrize("read", [jobs.read_outbox, jobs.read_received])
def test_a_partition_s_range_of_created_at_reaches_the_index(read: Any) -> None:
    """Spark's partitioned read wraps the query and bounds its created_at column: PostgreSQL
    must apply the bounds to the index scan of outbox_event (not filter the window's rows
    after the joins), or each partition reads the whole window."""
    low, high = T0 - timedelta(minutes=30), T0
    query = (
        f"SELECT * FROM ({_captured_query(read)}) AS source "
        f"WHERE \"created_at\" >= '{low:%Y-%m-%d %H:%M:%S}' "
        f"AND \"created_at\" < '{high:%Y-%m-%d %H:%M:%S}'"
    )
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL TIME ZONE 'UTC'")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {query}")
        plan = cursor.fetchone()[0]
    conditions = _index_conditions(
        plan if not isinstance(plan, str) else json.loads(plan), _created_at_indexes()
    )
    assert any(f"{high:%Y-%m-%d %H:%M:%S}+00" in condition for condition in conditions), plan
