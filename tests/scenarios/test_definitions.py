"""Parts of scenarios/definitions.py that need no scenario run: the late-lock writers and
how their run tells that it proved something. PostgreSQL only (the test database)."""

import json

import pytest
from django.db import connection, transaction

import outbox
from outbox.models import OutboxEvent
from outbox.services.event_log.ticks import Tick, tick_latest_after, tick_take
from scenarios.conf import AGGREGATE_TYPE, EVENT_TYPE
from scenarios.definitions import SCENARIOS, _late_lock_pairs, _late_lock_write, _visible
from scenarios.models import ScenarioAggregate
from scenarios.runner import Run
from tests.conftest import connect_outside_django


def test_a_transaction_is_visible_in_a_snapshot_taken_after_it_ended():
    # xmin:xmax:running, as pg_snapshot prints it.
    snapshot = "100:105:100,103"
    assert _visible(99, snapshot)
    assert not _visible(100, snapshot)  # still running
    assert _visible(101, snapshot)
    assert not _visible(103, snapshot)
    assert not _visible(105, snapshot)  # not yet started
    assert _visible(104, "105:105:")


@pytest.mark.django_db(transaction=True)
def test_a_late_lock_writer_publishes_its_aggregate_s_next_version_in_its_own_transaction():
    run = Run(SCENARIOS["late-lock-writers"], events=24, keys=1, seed=1)
    ScenarioAggregate.objects.create(run=run.run_id, key="k0")
    # 12 writers share the 24 events: writer 0 writes two of them.
    _late_lock_write(run, 0, 0.0)
    events = OutboxEvent.objects.filter(topic=run.topic).order_by("position")
    assert [(event.key, event.payload["version"]) for event in events] == [("k0", 1), ("k0", 2)]
    assert all(event.payload["seq"] == event.payload["version"] for event in events)
    assert len({event.transaction_id for event in events}) == 2
    assert ScenarioAggregate.objects.get(run=run.run_id, key="k0").version == 2
    assert run._commits == 2


def _publish_version(topic: str, version: int) -> None:
    with transaction.atomic():
        outbox.publish(
            aggregate_type=AGGREGATE_TYPE,
            aggregate_id="k0",
            event_type=EVENT_TYPE,
            payload={"version": version, "seq": version},
            topic=topic,
        )


def _insert_version(session, topic: str, version: int) -> None:
    """Writes an event of key k0 in `session`'s open transaction, as another writer would."""
    session.execute(
        """
        INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic,
                                  key, created_at)
        VALUES (gen_random_uuid(), %s, 'k0', %s, %s::jsonb, '{}', %s, 'k0', now())
        """,
        [AGGREGATE_TYPE, EVENT_TYPE, json.dumps({"version": version, "seq": version}), topic],
    )


def _tick(after: Tick) -> Tick:
    tick = tick_take(after=after)
    assert tick is not None
    return tick


@pytest.mark.django_db(transaction=True)
def test_late_lockers_are_counted_and_those_of_one_span_apart():
    run = Run(SCENARIOS["late-lock-writers"], events=4, keys=1, seed=1)
    start = tick_latest_after(tick_id=0)
    assert start is not None
    with connect_outside_django(connection.settings_dict, autocommit=True) as early:
        # v2's writer takes its transaction id before v1's, and commits after it, before the
        # next tick: both become visible at that tick, in one span.
        early.execute("BEGIN")
        early.execute("SELECT pg_current_xact_id()")
        _publish_version(run.topic, 1)
        _insert_version(early, run.topic, 2)
        early.execute("COMMIT")
        first = _tick(start)
        # v4's writer too, but a tick is taken between v3's commit and its own: two spans.
        early.execute("BEGIN")
        early.execute("SELECT pg_current_xact_id()")
        _publish_version(run.topic, 3)
        second = _tick(first)
        _insert_version(early, run.topic, 4)
        early.execute("COMMIT")
        _tick(second)
    assert _late_lock_pairs(run) == {"pairs": 3, "late_lockers": 2, "late_lockers_in_one_span": 1}


def test_the_tests_smaller_runs_plan_fewer_faults_and_full_size_runs_all():
    for name, small, full in (("leader-kill", 6, 10), ("relay-kill", 10, 20), ("baseline", 0, 0)):
        scenario = SCENARIOS[name]
        assert scenario.planned_faults_at(2_000) == small
        assert scenario.planned_faults_at(scenario.full_events()) == full
