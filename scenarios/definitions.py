"""The scenarios: which processes run, and the fault schedule that strikes while events flow.

Twelve must pass (0 lost, 0 duplicate effects, 0 order inversions, nothing stuck); the
`broken-*` ones run a deliberately broken consumer or relay and must fail the check, which
shows the checker can fail."""

import sys
from datetime import timedelta
from functools import partial

from outbox.models import OutboxEvent
from scenarios import faults
from scenarios.runner import Run, Scenario

# Wait after a broker restart, so every round starts from a healthy cluster.
HEALTHY_WAIT_SECONDS = 120.0
# Published_at comes from the relay's clock at the delivery report, read a moment after the
# broker acknowledged: an acknowledgement just before the outage may carry a time just after.
OUTAGE_GRACE_SECONDS = 2.0


def _standard(run: Run, *, relays: int = 1, consumers: int = 2) -> None:
    for index in range(1, relays + 1):
        run.add_relay(index)
    for index in range(1, consumers + 1):
        run.add_consumer(index)


def _no_faults(run: Run) -> None:
    pass


def _healthy(run: Run) -> None:
    if not faults.wait_in_sync(run.topic, timeout=HEALTHY_WAIT_SECONDS):
        run.extra_problems.append("the cluster did not get every replica back in sync")


# 2 ---------------------------------------------------------------------------------------


def _relay_kills(run: Run) -> None:
    relay = run.processes["relay-1"]
    for number in range(20):
        run.sleep(run.random.uniform(2, 5))
        run.fault(f"SIGKILL relay ({number + 1})", relay.kill)


# 3 ---------------------------------------------------------------------------------------


def _leader_kills(run: Run) -> None:
    run.sleep(3)
    for round_number in range(5):
        partition = round_number % 6
        leader = faults.partition_leader(run.topic, partition)
        run.fault(
            f"SIGKILL broker {leader} (leader of partition {partition})",
            partial(faults.kafka_kill, leader),
        )
        run.sleep(5)
        run.fault(f"restart broker {leader}", partial(faults.kafka_start, leader))
        _healthy(run)


# 4 ---------------------------------------------------------------------------------------


def _rolling_restart(run: Run) -> None:
    run.sleep(3)
    for node in range(1, faults.BROKERS + 1):
        run.fault(
            f"stop broker {node} (SIGTERM, controlled shutdown)",
            partial(faults.kafka_stop, node),
        )
        run.fault(f"start broker {node}", partial(faults.kafka_start, node))
        _healthy(run)


# 5 ---------------------------------------------------------------------------------------

OUTAGE_SECONDS = 60.0


def _two_brokers_down(run: Run) -> None:
    run.sleep(5)
    down = [2, 3]
    killed = [
        run.fault(f"SIGKILL broker {node}", partial(faults.kafka_kill, node)) for node in down
    ]
    outage_start = killed[-1].ended_at
    run.sleep(OUTAGE_SECONDS)
    outage_end = run.fault("outage ends", None).started_at
    for node in down:
        run.fault(f"restart broker {node}", partial(faults.kafka_start, node))
    run.extra["outage"] = {"start": outage_start.isoformat(), "end": outage_end.isoformat()}
    _healthy(run)


def _check_nothing_done_during_outage(run: Run) -> None:
    outage = run.extra.get("outage")
    if not outage:
        return
    from datetime import datetime

    start = datetime.fromisoformat(outage["start"]) + timedelta(seconds=OUTAGE_GRACE_SECONDS)
    end = datetime.fromisoformat(outage["end"])
    done = OutboxEvent.objects.filter(topic=run.topic, status="DONE")
    during = done.filter(published_at__gt=start, published_at__lt=end).count()
    run.extra["done_during_outage"] = during
    run.extra["done_before_outage"] = done.filter(published_at__lte=start).count()
    run.extra["done_after_outage"] = done.filter(published_at__gte=end).count()
    run.extra["pending_at_outage_end"] = (
        OutboxEvent.objects.filter(topic=run.topic, created_at__lt=end).count()
        - run.extra["done_before_outage"]
    )
    if during:
        run.extra_problems.append(
            f"{during} rows marked DONE while only one broker was up (fewer than 2 in sync)"
        )
    if run.extra["pending_at_outage_end"] <= 0:
        run.extra_problems.append("no event waited through the outage: the scenario proved nothing")


# 6 ---------------------------------------------------------------------------------------


def _broker_pause(run: Run) -> None:
    run.sleep(5)
    leader = faults.partition_leader(run.topic, 0)
    run.fault(
        f"SIGSTOP broker {leader} (leader of partition 0)", lambda: faults.kafka_pause(leader)
    )
    run.sleep(40)
    run.fault(f"SIGCONT broker {leader}", lambda: faults.kafka_resume(leader))
    _healthy(run)


# 7 ---------------------------------------------------------------------------------------


def _concurrent_start(run: Run) -> None:
    _standard(run, relays=3)
    run.add_celery_worker(1)
    run.add_celery_beat(1)
    run.add_celery_beat(2)


def _concurrent_faults(run: Run) -> None:
    run.production_done.wait()
    run.fault("three relays, two beat schedulers and a worker ran at once", None)


# 8 ---------------------------------------------------------------------------------------


def _consumer_kills(run: Run) -> None:
    names = [name for name in run.processes if name.startswith("consumer-")]
    for number in range(15):
        run.sleep(3)
        victim = run.processes[run.random.choice(names)]
        run.fault(f"SIGKILL {victim.name} ({number + 1})", victim.kill)


# 9 ---------------------------------------------------------------------------------------


def _rebalance_storm(run: Run) -> None:
    joined: list[str] = []
    next_index = 10
    for _ in range(20):
        run.sleep(2)
        if joined and (len(joined) >= 4 or run.random.random() < 0.4):
            name = joined.pop(run.random.randrange(len(joined)))
            run.fault(f"{name} leaves (SIGTERM)", run.processes[name].stop)
        else:
            consumer = run.add_consumer(next_index, static=False, keep_alive=False)
            next_index += 1
            joined.append(consumer.name)
            run.fault(f"{consumer.name} joins", None)


# 10 --------------------------------------------------------------------------------------


def _check_poison(run: Run) -> None:
    from inbox.models import InboxMessage

    expected = run.extra.get("poison_records", 0)
    rows = InboxMessage.objects.filter(consumer_group=run.group, topic=run.topic)
    known = {
        str(i) for i in OutboxEvent.objects.filter(topic=run.topic).values_list("id", flat=True)
    }
    poison = [
        status
        for event_id, status in rows.values_list("event_id", "status")
        if event_id not in known
    ]
    run.extra["poison_failed_rows"] = sum(1 for status in poison if status == "FAILED")
    if run.extra["poison_failed_rows"] != expected:
        run.extra_problems.append(
            f"{expected} poison records sent, {run.extra['poison_failed_rows']} FAILED inbox rows"
        )


# 11 --------------------------------------------------------------------------------------


def _postgres_crashes(run: Run) -> None:
    for number in range(3):
        run.sleep(8)
        run.fault(f"PostgreSQL immediate shutdown ({number + 1})", faults.postgres_crash)
        run.sleep(3)
        run.fault(f"PostgreSQL start ({number + 1})", faults.postgres_start)


# 12 --------------------------------------------------------------------------------------


def _celery_start(run: Run) -> None:
    _standard(run, relays=0)
    run.add_celery_worker(1)
    run.add_celery_beat(1)


def _celery_faults(run: Run) -> None:
    worker = run.processes["worker-1"]
    for number in range(2):
        run.sleep(5)
        run.fault(f"SIGKILL Celery worker ({number + 1})", worker.kill)
    run.sleep(3)
    run.fault("Redis stop", faults.redis_stop)
    run.sleep(5)
    run.fault("Redis start", faults.redis_start)
    run.sleep(4)
    run.fault("SIGKILL Celery worker (3)", worker.kill)


# Broken variants ------------------------------------------------------------------------


def _broken_consumers(run: Run) -> None:
    run.add_relay(1)
    for index in (1, 2):
        run.add_consumer(
            index,
            argv=[
                sys.executable,
                "manage.py",
                "scenario_broken",
                "consumer-commit-first",
                "--group",
                run.group,
            ],
            first_starts=2,
            # Broken for the first two starts of each: offsets committed before the database
            # transaction, then killed inside it.
            first_starts_env={"SCENARIO_BROKEN": "1", "INBOX_FAULT_INJECT": "before_db_commit"},
        )


def _broken_relay(run: Run) -> None:
    run.add(
        "relay-1",
        [sys.executable, "manage.py", "scenario_broken", "relay-done-first", "--slot", run.run_id],
        first_starts=2,
        # Records wait in the producer's queue, so the kill before the flush loses them.
        first_starts_env={"SCENARIO_BROKEN": "1", "OUTBOX_PRODUCER_LINGER_MS": "20000"},
    )
    for index in (1, 2):
        run.add_consumer(index)


def _no_dedup_consumers(run: Run) -> None:
    run.add_relay(1)
    for index in (1, 2):
        run.add_consumer(
            index,
            env={"INBOX_DEDUPLICATE": "false"},
            first_starts=2,
            first_starts_env={"INBOX_FAULT_INJECT": "after_db_commit"},
        )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("baseline", "Baseline, no faults", False, _standard, _no_faults),
        Scenario(
            "relay-kill",
            "Relay SIGKILLed every 2-5 s, 20 times",
            True,
            _standard,
            _relay_kills,
            production_seconds=60,
        ),
        Scenario(
            "leader-kill",
            "Partition leader SIGKILLed and restarted, 5 rounds",
            True,
            _standard,
            _leader_kills,
            production_seconds=60,
        ),
        Scenario(
            "rolling-restart",
            "Clean rolling restart of every broker",
            False,
            _standard,
            _rolling_restart,
            production_seconds=40,
        ),
        Scenario(
            "two-brokers-down",
            "Two brokers down for 60 s",
            True,
            _standard,
            _two_brokers_down,
            production_seconds=40,
            after=_check_nothing_done_during_outage,
        ),
        Scenario(
            "broker-pause",
            "A broker paused with SIGSTOP for 40 s",
            True,
            _standard,
            _broker_pause,
            production_seconds=30,
        ),
        Scenario(
            "concurrent-relays",
            "Three relays and two beat schedulers at once",
            False,
            _concurrent_start,
            _concurrent_faults,
            production_seconds=20,
        ),
        Scenario(
            "consumer-kill",
            "Consumers SIGKILLed every 3 s, 15 times",
            True,
            lambda run: _standard(run, consumers=3),
            _consumer_kills,
            production_seconds=40,
        ),
        Scenario(
            "rebalance-storm",
            "Consumers joining and leaving every 2 s",
            True,
            _standard,
            _rebalance_storm,
            production_seconds=35,
        ),
        Scenario(
            "poison",
            "100 poison records among the events",
            False,
            _standard,
            _no_faults,
            production_seconds=10,
            poison=100,
            after=_check_poison,
        ),
        Scenario(
            "postgres-crash",
            "PostgreSQL stopped in immediate mode 3 times",
            True,
            _standard,
            _postgres_crashes,
            production_seconds=30,
        ),
        Scenario(
            "celery-redis",
            "Celery worker SIGKILLed, Redis restarted",
            True,
            _celery_start,
            _celery_faults,
            production_seconds=25,
        ),
        Scenario(
            "broken-consumer-commit-first",
            "BROKEN consumer: offsets committed before the database transaction",
            False,
            _broken_consumers,
            _no_faults,
            production_seconds=5,
            expect_fail=True,
            stall_seconds=20,
        ),
        Scenario(
            "broken-relay-done-first",
            "BROKEN relay: rows marked DONE before the delivery report",
            False,
            _broken_relay,
            _no_faults,
            production_seconds=5,
            expect_fail=True,
            stall_seconds=20,
        ),
        Scenario(
            "broken-no-dedup",
            "BROKEN consumer: no inbox deduplication, killed after its commit",
            False,
            _no_dedup_consumers,
            _no_faults,
            production_seconds=5,
            expect_fail=True,
            stall_seconds=20,
        ),
    )
}

# The suite `scenario_run` runs when no name is given: the ones that must pass.
SUITE = [name for name, scenario in SCENARIOS.items() if not scenario.expect_fail]
BROKEN = [name for name, scenario in SCENARIOS.items() if scenario.expect_fail]


def pick(names: list[str]) -> list[Scenario]:
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise KeyError(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    return [SCENARIOS[name] for name in names]
