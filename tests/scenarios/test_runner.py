"""The runner's own measures, on rows written by the test: no service but PostgreSQL."""

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

import outbox
from outbox.models import OutboxEvent
from scenarios.definitions import SCENARIOS
from scenarios.models import ScenarioEffect
from scenarios.runner import Fault, Run

pytestmark = pytest.mark.django_db


def _fault(
    what: str, started_at: datetime, seconds: float, *, seen: bool | None, check: bool = False
) -> Fault:
    return Fault(
        what,
        0.0,
        seconds,
        started_at,
        started_at + timedelta(seconds=seconds),
        verified=seen,
        check=check,
    )


def test_a_fault_counts_the_events_it_struck_on_their_way_and_no_others():
    run = Run(SCENARIOS["relay-kill"], events=3, keys=3, seed=1)
    with transaction.atomic():
        events = [
            outbox.publish(
                aggregate_type="order",
                aggregate_id=f"k{number}",
                event_type="Placed",
                payload={"n": number},
                topic=run.topic,
            )
            for number in range(3)
        ]
    written = events[0].created_at
    # The first is applied at once, the second 10 s after it was written, the third 60 s after.
    for event, delay in zip(events, (0.5, 10, 60), strict=True):
        ScenarioEffect.objects.create(
            run=run.run_id,
            consumer_group=run.group,
            event_id=str(event.id),
            key=event.key,
            seq=0,
            pid=1,
            applied_at=written + timedelta(seconds=delay),
        )
    run.faults = [
        # Before anything was written: nothing on its way.
        _fault("before", written - timedelta(seconds=30), 1, seen=True),
        # 5 s after the writes: the second and third were written and not yet applied.
        _fault("in flight", written + timedelta(seconds=5), 1, seen=True),
        # After every event was applied: an idle system.
        _fault("after", written + timedelta(seconds=120), 1, seen=True),
        # An entry that is no fault (a restart, a check of what a fault left) is not counted.
        _fault("restart", written + timedelta(seconds=5), 1, seen=None),
        _fault("check", written + timedelta(seconds=5), 1, seen=True, check=True),
    ]
    assert run._in_flight_at_faults() == [0, 2, 0]


def test_a_poison_record_s_effect_is_no_event_on_its_way():
    run = Run(SCENARIOS["poison"], events=1, keys=1, seed=1)
    now = datetime.now(UTC)
    ScenarioEffect.objects.create(
        run=run.run_id,
        consumer_group=run.group,
        event_id="5d1e2b64-0e5c-4a57-9d55-9d1c2f0a8f11",
        key="k",
        seq=0,
        pid=1,
        applied_at=now,
    )
    run.faults = [_fault("kill", now - timedelta(seconds=1), 1, seen=True)]
    assert run._in_flight_at_faults() == [0]


@pytest.mark.django_db(transaction=True)  # the writer commits and closes its connection
def test_a_fault_aimed_at_the_next_commit_waits_for_a_writer_s_commit_or_for_no_writer_left():
    run = Run(SCENARIOS["relay-kill"], events=8, keys=8, seed=1)
    run.faults_done.set()  # no schedule to wait for: each writer writes all it has at once
    moment = run.after_next_commit()
    assert not moment()
    run._write(0, 0.0, 0)
    assert moment()
    # Asked afresh: writer 0 is done, three writers may still commit.
    assert not run.after_next_commit()()
    for writer in (1, 2, 3):
        run._write(writer, 0.0, 0)
    # No writer can commit any more: a fault waiting for a commit would wait for nothing.
    assert run.after_next_commit()()
    assert OutboxEvent.objects.filter(topic=run.topic).count() == 8


@pytest.mark.django_db(transaction=True)
def test_a_fault_aimed_at_the_next_commit_lets_a_writer_waiting_for_it_write_its_next_step():
    # Three planned faults: a writer of 3 transactions writes its first at once (up to 1/4
    # of its events before the first fault), its second after the first fault (up to 2/4),
    # its last after the schedule.
    run = Run(
        replace(SCENARIOS["relay-kill"], planned_faults=3, small_planned_faults=0),
        events=12,
        keys=12,
        seed=1,
    )
    writer = threading.Thread(target=run._write, args=(0, 0.0, 0))
    writer.start()
    try:
        assert run.wait_for_moment(lambda: run._commits == 1, 10)
        time.sleep(0.2)
        assert run._commits == 1  # waiting for the first fault
        moment = run.after_next_commit()
        assert run.wait_for_moment(moment, 10)  # the announced fault let it write its second
        assert run._commits == 2
        time.sleep(0.2)
        assert run._commits == 2  # the last waits for the end of the schedule
    finally:
        run.faults_done.set()
        with run._schedule:
            run._schedule.notify_all()
        writer.join(10)
    assert run._commits == 3
