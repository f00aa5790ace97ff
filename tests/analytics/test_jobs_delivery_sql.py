"""The job's SQL reading of an event's delivery, without Spark: the queries the job sends over
JDBC, run by the test's own connection. Each kind of history either relay leaves gives the
status and placement of outbox.selectors.outbox_events_with_delivery and the attempts the
claim relay would have counted; a partitioned read's range of created_at reaches the index."""

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
from tests.analytics.factories import delivery_record, held_event

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
SINCE = T0 - timedelta(hours=1)
UNTIL = T0 + timedelta(hours=1)
PUBLISHED = OutboxDelivery.Outcome.PUBLISHED
DISCARDED = OutboxDelivery.Outcome.DISCARDED
FAILED = OutboxDelivery.Outcome.FAILED
DONE_ROW = {"status": OutboxEvent.Status.DONE, "attempts": 1}
# When a held head waiting for its retry is due.
LATER = datetime.now(tz=UTC) + timedelta(hours=1)


@dataclass(frozen=True)
class Case:
    """An event's row, its delivery records (outcome, seconds after creation, partition,
    offset) in order, its held row (attempts, next attempt due), and what the job reads."""

    row: dict[str, Any]
    records: Sequence[tuple[str, int, int | None, int | None]] = ()
    held: tuple[int, datetime | None] | None = None
    status: str = OutboxEvent.Status.DONE
    attempts: int = 1


CASES = {
    # The claim relay's rows.
    "claim: published": Case(
        row={**DONE_ROW, "published_after": 1, "kafka_partition": 0, "kafka_offset": 5}
    ),
    "claim: not yet claimed": Case(row={}, status="PENDING", attempts=0),
    "claim: discarded": Case(
        row={"status": "FAILED", "attempts": 10, "discarded": True}, status="FAILED", attempts=10
    ),
    # The event-log relay's records and held events; its rows stay as publish() wrote them.
    "log: published": Case(row={}, records=[(PUBLISHED, 1, 1, 7)]),
    "log: retried, then published": Case(
        row={},
        records=[(FAILED, 1, None, None), (FAILED, 2, None, None), (PUBLISHED, 3, 0, 9)],
        attempts=3,
    ),
    "log: queued behind its key's head": Case(row={}, held=(0, None), status="PENDING", attempts=0),
    "log: waiting for its retry": Case(
        row={}, records=[(FAILED, 1, None, None)] * 2, held=(2, LATER), status="PENDING", attempts=2
    ),
    "log: attempts spent": Case(
        row={}, records=[(FAILED, 1, None, None)] * 3, held=(3, None), status="FAILED", attempts=3
    ),
    "log: discarded": Case(
        row={},
        records=[(FAILED, 1, None, None)] * 2 + [(DISCARDED, 60, None, None)],
        status="FAILED",
        attempts=2,
    ),
    "log: replayed": Case(row={}, records=[(PUBLISHED, 1, 0, 3), (PUBLISHED, 600, 1, 40)]),
    "log: replayed, waiting for its turn": Case(
        row={}, records=[(PUBLISHED, 1, 0, 3)], held=(0, None), status="PENDING", attempts=0
    ),
    "log: replayed, failing": Case(
        row={},
        records=[(PUBLISHED, 1, 0, 3), (FAILED, 600, None, None)],
        held=(1, LATER),
        status="PENDING",
        attempts=1,
    ),
    "log: discarded, replayed": Case(
        row={},
        records=[(FAILED, 1, None, None), (DISCARDED, 60, None, None), (PUBLISHED, 600, 1, 2)],
    ),
    # An operator's retry of a spent event leaves no record: the tries before it count too
    # (the claim relay starts again from 0).
    "log: spent, retried by an operator, published": Case(
        row={}, records=[(FAILED, 1, None, None)] * 3 + [(PUBLISHED, 900, 0, 8)], attempts=4
    ),
    # Across the switch: rows the claim relay wrote, records of the event-log relay.
    "switch: tried by the claim relay, published by the event-log relay": Case(
        row={"attempts": 2}, records=[(PUBLISHED, 30, 1, 11)], attempts=3
    ),
    "switch: published by the claim relay, replayed by the event-log relay": Case(
        row={**DONE_ROW, "published_after": 1, "kafka_partition": 0, "kafka_offset": 1},
        records=[(PUBLISHED, 600, 1, 12)],
    ),
    "switch: FAILED on the claim relay, taken over": Case(
        row={"status": "FAILED", "attempts": 5}, held=(5, None), status="FAILED", attempts=5
    ),
    "switch: FAILED on the claim relay, taken over, discarded": Case(
        row={"status": "FAILED", "attempts": 5},
        records=[(DISCARDED, 60, None, None)],
        status="FAILED",
        attempts=5,
    ),
}


def _event(name: str, case: Case, created: datetime) -> OutboxEvent:
    row = dict(case.row)
    published_after = row.pop("published_after", None)
    discarded = row.pop("discarded", False)
    event = OutboxEvent.objects.create(
        aggregate_type="orders",
        aggregate_id=name,
        event_type="order.created",
        payload={},
        topic="orders",
        key=name,
        created_at=created,
        published_at=None
        if published_after is None
        else created + timedelta(seconds=published_after),
        discarded_at=created + timedelta(minutes=5) if discarded else None,
        **row,
    )
    for outcome, seconds, partition, offset in case.records:
        delivery_record(
            event_id=event.id,
            outcome=outcome,
            at=created + timedelta(seconds=seconds),
            partition=partition,
            offset=offset,
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
    assert read["log: replayed"][2:5] == (created["log: replayed"] + timedelta(seconds=600), 1, 40)


def _index_conditions(plan: Any) -> list[str]:
    """The index conditions of the plan's scans of outbox_event's created_at index."""
    found = []
    if isinstance(plan, dict):
        if plan.get("Index Name") == "outbox_event_created_idx":
            found.append(plan.get("Index Cond", ""))
        for value in plan.values():
            found += _index_conditions(value)
    elif isinstance(plan, list):
        for value in plan:
            found += _index_conditions(value)
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
    conditions = _index_conditions(plan if not isinstance(plan, str) else json.loads(plan))
    assert any(f"{high:%Y-%m-%d %H:%M:%S}+00" in condition for condition in conditions), plan
