"""The scenarios: which processes run, and the fault schedule that strikes while events flow.

Twenty-four must pass (0 lost, 0 duplicate effects, 0 order inversions, nothing stuck); the
`broken-*` ones run a deliberately broken consumer or relay and must fail the check, which
shows the checker can fail."""

import bisect
import itertools
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import environ
import psycopg
from confluent_kafka.admin import AclBinding, AclOperation, ResourceType
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

import outbox
from inbox.models import ConsumerOffset, InboxMessage
from outbox.conf import outbox_settings
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.selectors import outbox_events_with_delivery, outbox_quarantined_keys
from outbox.services.event_log.cursors import Cursor
from outbox.services.event_log.shards import ALL_SHARDS, SHARD_LOCK_CLASS
from outbox.services.event_log.spans import batch_read
from outbox.services.event_log.ticks import Tick, tick_latest_after
from outbox.services.nudge import nudge_redis_url
from outbox.services.partitions import day_start, partition_create, partitions_read
from outbox.services.repairs import outbox_event_replay, outbox_events_replay, outbox_events_retry
from outbox.services.retention import outbox_event_log_purge
from scenarios import faults, ports
from scenarios.checker import check, load_outbox, read_log, version_check
from scenarios.conf import (
    AGGREGATE_TYPE,
    EVENT_TYPE,
    FAILURE_PERCENT_VARIABLE,
    REFUSED_EVENT_VARIABLE,
)
from scenarios.models import ScenarioAggregate, ScenarioEffect
from scenarios.runner import (
    PARTITIONS,
    SESSION_NAME_PREFIX,
    Fault,
    Killed,
    Managed,
    Run,
    Scenario,
    create_topic,
)
from scenarios.secured_kafka import READER, WRITER, allowed

# Wait after a broker restart, so every round starts from a healthy cluster.
HEALTHY_WAIT_SECONDS = 120.0
# How long the controller may take to move leadership off a broker that died (it fences it
# after broker.session.timeout.ms, 9 s by default) or that shuts down.
LEADER_MOVE_SECONDS = 60.0
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


# How long a fault aimed at the writers' next commit (Run.after_next_commit) waits for it
# before it strikes anyway.
COMMIT_WAIT_SECONDS = 10.0
JUST_COMMITTED = "a transaction just committed"


def _kill_after_next_commit(run: Run, what: str, process: Managed) -> None:
    """A SIGKILL right after a writer's next commit, so that it strikes events on their way;
    the fault is seen by the SIGKILL alone (with no commit in COMMIT_WAIT_SECONDS it strikes
    anyway, and its log line says so)."""
    run.kill(
        what,
        process,
        when=run.after_next_commit(),
        moment=JUST_COMMITTED,
        when_timeout=COMMIT_WAIT_SECONDS,
        aim_seen=False,
    )


RELAY_KILLS = 20
# The tests' runs, smaller than full size.
RELAY_KILLS_SMALL = 10


def _relay_kills(run: Run) -> None:
    relay = run.processes["relay-1"]
    for number in range(run.planned_faults):
        run.sleep(run.random.uniform(2, 5))
        _kill_after_next_commit(run, f"SIGKILL relay ({number + 1})", relay)


# 3 ---------------------------------------------------------------------------------------


def _leader_now(topic: str, partition: int) -> int | None:
    try:
        return faults.partition_leader(topic, partition, timeout=30)
    except Exception:  # only recorded: the round's checks do not depend on it
        return None


LEADER_KILL_ROUNDS = 5
# The tests' runs: three of the six partitions' leaders (about 35 s a round).
LEADER_KILL_SMALL_ROUNDS = 3


def _leader_kills(run: Run) -> None:
    run.sleep(3)
    rounds: list[dict[str, Any]] = []
    run.extra["leader_kills"] = rounds
    # Two entries a round: the kill and the restart.
    for round_number in range(run.planned_faults // 2):
        partition = round_number % PARTITIONS
        # A partition without a leader (-1, an election under way) is waited for, never
        # "killed": faults.partition_leader raises if none comes.
        leader = faults.partition_leader(run.topic, partition)
        killed = run.fault(
            f"SIGKILL broker {leader} (leader of partition {partition})",
            partial(faults.kafka_kill, leader),
        )
        killed.detail = f"pid {killed.result}"
        # Down 5 s at least, and until the controller has moved the partition's leadership
        # to another broker: the proof that the leader really died.
        run.sleep(5)
        moved = faults.wait_leader_moved(
            run.topic, partition, away_from=leader, timeout=LEADER_MOVE_SECONDS
        )
        run.verify(
            killed,
            seen=moved is not None,
            effect=f"partition {partition} led by another broker than {leader} within "
            f"{LEADER_MOVE_SECONDS:.0f} s",
        )
        restarted = run.fault(f"restart broker {leader}", partial(faults.kafka_start, leader))
        restarted.detail = f"pid {restarted.result}; partition {partition} led by {moved} meanwhile"
        _healthy(run)
        rounds.append(
            {
                "partition": partition,
                "broker": leader,
                "killed_pid": killed.result,
                "leader_while_down": moved,
                "restarted_pid": restarted.result,
                "leader_after": _leader_now(run.topic, partition),
            }
        )


# 4 ---------------------------------------------------------------------------------------


def _rolling_restart(run: Run) -> None:
    run.sleep(3)
    restarts: list[dict[str, Any]] = []
    run.extra["restarts"] = restarts
    for node in range(1, faults.BROKERS + 1):
        stopped = run.fault(
            f"stop broker {node} (SIGTERM, controlled shutdown)",
            partial(faults.kafka_stop, node),
        )
        report: faults.Stopped = stopped.result
        stopped.detail = f"pid {report.pid}" + (
            ", ignored SIGTERM: SIGKILLed" if report.forced else ""
        )
        # While it is down, every partition is led by another broker.
        leaders = faults.wait_leaders_off(run.topic, node, timeout=LEADER_MOVE_SECONDS)
        run.verify(
            stopped,
            seen=leaders is not None,
            effect=f"every partition led by another broker than {node} within "
            f"{LEADER_MOVE_SECONDS:.0f} s",
        )
        started = run.fault(f"start broker {node}", partial(faults.kafka_start, node))
        started.detail = f"pid {started.result}"
        _healthy(run)
        restarts.append(
            {
                "broker": node,
                "stopped_pid": report.pid,
                "forced": report.forced,
                "leaders_while_down": leaders,
                "started_pid": started.result,
            }
        )


# 5 ---------------------------------------------------------------------------------------

OUTAGE_SECONDS = 60.0
# The tests' runs, smaller than full size: still past the relay's delivery timeout (35 s).
OUTAGE_SECONDS_SMALL = 40.0


def _two_brokers_down(run: Run) -> None:
    run.sleep(5)
    down = [2, 3]
    killed = [
        run.fault(f"SIGKILL broker {node}", partial(faults.kafka_kill, node)) for node in down
    ]
    for fault in killed:
        fault.detail = f"pid {fault.result}"
    outage_start = killed[-1].ended_at
    # Seen by the brokers' listeners refusing connections. Not by leadership: with two of the
    # three controllers down the metadata quorum is lost, and no leadership moves until one
    # is back. That the outage stopped publishing is _check_nothing_done_during_outage's.
    for node, fault in zip(down, killed, strict=True):
        run.verify(
            fault,
            seen=faults.kafka_refuses(node),
            effect=f"broker {node}'s listener refused a connection",
        )
    run.sleep(OUTAGE_SECONDS if run.events >= run.scenario.full_events() else OUTAGE_SECONDS_SMALL)
    outage_end = run.fault("outage ends", None).started_at
    for node in down:
        restarted = run.fault(f"restart broker {node}", partial(faults.kafka_start, node))
        restarted.detail = f"pid {restarted.result}"
    run.extra["outage"] = {"start": outage_start.isoformat(), "end": outage_end.isoformat()}
    _healthy(run)


def _check_nothing_done_during_outage(run: Run) -> None:
    outage = run.extra.get("outage")
    if not outage:
        return
    from datetime import datetime

    start = datetime.fromisoformat(outage["start"]) + timedelta(seconds=OUTAGE_GRACE_SECONDS)
    end = datetime.fromisoformat(outage["end"])
    events = OutboxEvent.objects.filter(topic=run.topic)
    done = outbox_events_with_delivery(events).filter(delivery_status="DONE")
    during = done.filter(delivered_at__gt=start, delivered_at__lt=end).count()
    run.extra["done_during_outage"] = during
    run.extra["done_before_outage"] = done.filter(delivered_at__lte=start).count()
    run.extra["done_after_outage"] = done.filter(delivered_at__gte=end).count()
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


PAUSE_SECONDS = 40.0


def _broker_pause(run: Run) -> None:
    run.sleep(5)
    leader = faults.partition_leader(run.topic, 0)
    paused = run.fault(
        f"SIGSTOP broker {leader} (leader of partition 0)", lambda: faults.kafka_pause(leader)
    )
    paused.detail = f"pid {paused.result}"
    # A stopped broker stops heartbeating: the controller fences it (broker.session.timeout.ms,
    # 9 s) and moves its leaderships. A broker that went on running would keep partition 0.
    moved = faults.wait_leader_moved(run.topic, 0, away_from=leader, timeout=PAUSE_SECONDS - 5)
    run.extra["pause"] = {"broker": leader, "leader_while_paused": moved}
    run.verify(
        paused,
        seen=moved is not None,
        effect=f"partition 0 led by another broker than {leader} within {PAUSE_SECONDS - 5:.0f} s",
    )
    run.sleep(max(0.0, PAUSE_SECONDS - (time.monotonic() - paused.ended)))
    resumed = run.fault(f"SIGCONT broker {leader}", lambda: faults.kafka_resume(leader))
    resumed.detail = f"pid {resumed.result}"
    _healthy(run)


# 7 ---------------------------------------------------------------------------------------


def _concurrent_start(run: Run) -> None:
    _standard(run, relays=3)
    run.add_celery_worker(1)
    run.add_celery_beat(1)
    run.add_celery_beat(2)


CONCURRENT = ("relay-1", "relay-2", "relay-3", "beat-1", "beat-2", "worker-1")


def _concurrent_faults(run: Run) -> None:
    # The fault is the concurrency itself: halfway through the writing, all of them run.
    run.sleep(run.scenario.production_seconds / 2)
    running = run.fault(
        "three relays, two beat schedulers and a worker running at once",
        lambda: [name for name in CONCURRENT if run.processes[name].alive],
    )
    running.detail = f"running: {', '.join(running.result)}"
    run.verify(
        running,
        seen=len(running.result) == len(CONCURRENT),
        effect=f"all of {', '.join(CONCURRENT)} running",
    )


def _check_concurrent(run: Run) -> None:
    """From their logs: each relay started, listened and published; each beat sent relay
    tasks; the worker ran them."""
    seen: dict[str, dict[str, int]] = {}
    for name in ("relay-1", "relay-2", "relay-3"):
        log = run.processes[name].log_text()
        seen[name] = {
            "started": log.count(" listening on "),
            "published": sum(
                int(n) for n in re.findall(r"stopped after publishing (\d+) events", log)
            ),
        }
    for name in ("beat-1", "beat-2"):
        log = run.processes[name].log_text()
        seen[name] = {"sent": len(re.findall(r"Sending due task outbox-relay\b", log))}
    log = run.processes["worker-1"].log_text()
    results = re.findall(r"Task outbox\.tasks\.relay\[[^]]+\] succeeded in [\d.]+s: (\d+)", log)
    seen["worker-1"] = {"relay_tasks": len(results), "published": sum(map(int, results))}
    run.extra["concurrent"] = seen
    for name in ("relay-1", "relay-2", "relay-3"):
        if not seen[name]["started"] or not seen[name]["published"]:
            run.extra_problems.append(f"{name} did not start or published nothing: {seen[name]}")
    for name in ("beat-1", "beat-2"):
        if not seen[name]["sent"]:
            run.extra_problems.append(f"{name} sent no relay task")


# 8 ---------------------------------------------------------------------------------------


CONSUMER_KILLS = 15
CONSUMER_KILLS_SMALL = 8


def _consumer_kills(run: Run) -> None:
    names = [name for name in run.processes if name.startswith("consumer-")]
    for number in range(run.planned_faults):
        run.sleep(3)
        victim = run.processes[run.random.choice(names)]
        _kill_after_next_commit(run, f"SIGKILL {victim.name} ({number + 1})", victim)


# 9 ---------------------------------------------------------------------------------------


# How long a joining consumer may take to get its first assignment; the storm waits for the
# last joiners this long at its end.
JOIN_SECONDS = 30.0


def _assigned(run: Run, name: str) -> bool:
    """Whether the consumer's log shows an assignment of the storm's group: it took part in a
    rebalance as a member (the callback runs after the group's sync, even for no partition)."""
    return f"Group {run.group}: assigned " in run.processes[name].log_text()


def _a_member(run: Run, joined: list[str]) -> str | None:
    """One of the joined consumers that became a member (the storm's leaves are rebalances
    too), drawn at random; it waits up to JOIN_SECONDS for one. None: none became one."""
    deadline = time.monotonic() + JOIN_SECONDS
    while True:
        members = [name for name in joined if _assigned(run, name)]
        if members:
            return members[run.random.randrange(len(members))]
        if time.monotonic() >= deadline:
            return None
        run.sleep(0.5)


def _rebalance_storm(run: Run) -> None:
    joined: list[str] = []
    joins: dict[str, Fault] = {}
    next_index = 10
    # The group's members after each step, as its coordinator reports them (None: it could
    # not say).
    members: list[dict[str, int] | None] = []
    run.extra["group_members"] = members
    for _ in range(20):
        run.sleep(2)
        leaving = (
            _a_member(run, joined)
            if joined and (len(joined) >= 4 or run.random.random() < 0.4)
            else None
        )
        # Each join or leave right after a writer's commit: it meets events on their way.
        committed = run.wait_for_moment(run.after_next_commit(), COMMIT_WAIT_SECONDS)
        moment = f", {JUST_COMMITTED}: {'yes' if committed else 'no'}"
        if leaving is not None:
            joined.remove(leaving)
            left = run.fault(f"{leaving} leaves (SIGTERM)", run.processes[leaving].stop)
            left.detail = f"pid {run.processes[leaving].pids[-1]}, exit code {left.result}{moment}"
            run.verify(
                left,
                seen=left.result is not None and not run.processes[leaving].alive,
                effect=f"{leaving} was a member, and exited",
            )
        else:
            added = run.fault(
                f"consumer-{next_index} joins",
                # At INFO its log has the assignment that shows it became a member.
                partial(
                    run.add_consumer,
                    next_index,
                    static=False,
                    keep_alive=False,
                    env={"LOG_LEVEL": "INFO"},
                ),
            )
            added.detail = f"pid {added.result.pids[-1]}{moment}"
            joins[added.result.name] = added
            next_index += 1
            joined.append(added.result.name)
        current = run.group_members()
        members.append(
            None
            if current is None
            else {
                "static": len(current) - current.count("dynamic"),
                "dynamic": current.count("dynamic"),
            }
        )
    deadline = time.monotonic() + JOIN_SECONDS
    while time.monotonic() < deadline and not all(_assigned(run, name) for name in joins):
        run.sleep(0.5)
    for name, added in joins.items():
        run.verify(
            added,
            seen=_assigned(run, name),
            effect=f"{name} got an assignment of the group (its log)",
        )


def _check_rebalance(run: Run) -> None:
    """The storm reached the group: dynamic members were in it, and took records."""
    seen = [m for m in run.extra.get("group_members", []) if m is not None]
    run.extra["most_dynamic_members"] = max((m["dynamic"] for m in seen), default=0)
    run.extra["dynamic_consumers_applying"] = sorted(
        name
        for name, count in run.extra["effects_by_process"].items()
        if count and name.startswith("consumer-") and int(name.split("-")[1]) >= 10
    )
    if not run.extra["most_dynamic_members"]:
        run.extra_problems.append("no joining consumer was ever seen in the group")
    if not run.extra["dynamic_consumers_applying"]:
        run.extra_problems.append("no joining consumer applied an event")
    protocol = run.scenario.group_protocol
    if run.extra.get("group_types") != [protocol]:
        run.extra_problems.append(
            f"the coordinator ran the group as {run.extra.get('group_types')}, not {protocol}"
        )


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


RECOVERY_LINE = "database system was not properly shut down; automatic recovery in progress"


def _postgres_crashes(run: Run) -> None:
    crashes: list[dict[str, Any]] = []
    run.extra["postgres_crashes"] = crashes
    log = faults.postgres_log()
    for number in range(3):
        run.sleep(8)
        log_size = log.stat().st_size if log.exists() else 0
        crashed = run.fault(f"PostgreSQL immediate shutdown ({number + 1})", faults.postgres_crash)
        crashed.detail = f"postmaster pid {crashed.result}"
        run.sleep(3)
        started = run.fault(f"PostgreSQL start ({number + 1})", faults.postgres_start)
        started.detail = f"postmaster pid {started.result}"
        with log.open("rb") as file:
            file.seek(log_size)
            recovered = RECOVERY_LINE in file.read().decode(errors="replace")
        run.verify(
            crashed,
            seen=recovered,
            effect=f"PostgreSQL start {number + 1} logged a crash recovery",
        )
        crashes.append(
            {"crashed_pid": crashed.result, "started_pid": started.result, "recovered": recovered}
        )


# 12 --------------------------------------------------------------------------------------


def _celery_start(run: Run) -> None:
    _standard(run, relays=0)
    run.add_celery_worker(1)
    run.add_celery_beat(1)


# A Celery worker with its pool: the main process and --concurrency children.
WORKER_PROCESSES = 3
REDIS_DOWN_SECONDS = 5.0


def _kill_worker(run: Run, number: int) -> None:
    """SIGKILLs the worker once its pool is up (a worker still starting has no task to
    lose), a moment later, while beat keeps sending it relay tasks."""
    worker = run.processes["worker-1"]
    if not worker.wait_group(WORKER_PROCESSES, timeout=60):
        run.extra_problems.append(f"the worker's pool was not up for kill {number}")
    run.sleep(run.random.uniform(1, 2))
    killed = run.kill(f"SIGKILL Celery worker ({number})", worker)
    if killed.result is not None:
        killed.detail = (
            f"process group {killed.result.group}, missed by the signal "
            f"{killed.result.spared}, alive 10 s later {killed.result.survivors}"
        )


def _celery_faults(run: Run) -> None:
    for number in (1, 2):
        _kill_worker(run, number)
    run.sleep(3)
    stopped = run.fault("Redis stop", faults.redis_stop)
    stopped.detail = f"pid {stopped.result}"
    # Refused at the start of the window and at its end: Redis was down throughout.
    refused = [faults.redis_refuses()]
    run.sleep(max(0.0, REDIS_DOWN_SECONDS - (time.monotonic() - stopped.ended)))
    refused.append(faults.redis_refuses())
    run.extra["redis_refused"] = refused
    run.verify(
        stopped,
        seen=all(refused),
        effect=f"Redis refused connections at the start and the end of the "
        f"{REDIS_DOWN_SECONDS:.0f} s: {refused}",
    )
    run.fault("Redis start", faults.redis_start)
    _kill_worker(run, 3)


# 13-15: the event-log relay ---------------------------------------------------------------

# The long-running transaction stays open this long, and pg_dump runs inside that time.
SNAPSHOT_HOLD_SECONDS = 40.0


def _published_count(run: Run) -> int:
    """Events of the run the event-log relay has recorded as published."""
    return OutboxDelivery.objects.filter(
        outcome=OutboxDelivery.Outcome.PUBLISHED,
        event_id__in=OutboxEvent.objects.filter(topic=run.topic).values("id"),
    ).count()


def _event_table_updates() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        # The partitioned table's own row counts nothing: its partitions hold the rows.
        cursor.execute(
            """
            SELECT coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables
            WHERE relid IN (SELECT relid FROM pg_partition_tree('outbox_event'))
            """
        )
        return int(cursor.fetchone()[0])


def _session_horizon(pid: int) -> dict[str, Any]:
    """The session's state, backend_xmin (the snapshot it holds) and backend_xid (the
    transaction id it holds), from pg_stat_activity; all None when it is gone."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, backend_xmin::text, backend_xid::text FROM pg_stat_activity "
            "WHERE pid = %s",
            [pid],
        )
        row = cursor.fetchone()
    state, xmin, xid = row if row else (None, None, None)
    return {"state": state, "xmin": xmin, "xid": xid}


def _open_snapshot(
    run: Run,
    reader: psycopg.Connection,
    *,
    read: str = "SELECT count(*) FROM outbox_event",
    take_xid: bool = False,
) -> dict[str, Any]:
    """Opens a REPEATABLE READ transaction on `reader` and reads (its snapshot is taken); with
    `take_xid`, it then takes a transaction id, as a writer's first write would."""
    reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    reader.execute(read).fetchone()
    if take_xid:
        reader.execute("SELECT pg_current_xact_id()").fetchone()
    pid = reader.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    horizon = _session_horizon(pid)
    return {
        "pid": pid,
        "xmin": horizon["xmin"],
        "xid": horizon["xid"],
        "published": _published_count(run),
    }


def _close_snapshot(run: Run, reader: psycopg.Connection, opened: dict[str, Any]) -> dict:
    horizon = _session_horizon(opened["pid"])
    closing = {"xmin": horizon["xmin"], "xid": horizon["xid"], "published": _published_count(run)}
    reader.execute("ROLLBACK")
    return closing


def _pg_dump() -> int:
    """Dumps the whole database, as a backup would, and returns the size of the dump."""
    database = settings.DATABASES["default"]
    pg_dump = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")) / "pg_dump"
    dumped = subprocess.run(
        [
            str(pg_dump) if pg_dump.exists() else "pg_dump",
            "--host",
            str(database["HOST"]),
            "--port",
            str(database["PORT"]),
            "--username",
            str(database["USER"]),
            "--dbname",
            str(database["NAME"]),
        ],
        env={**os.environ, "PGPASSWORD": str(database["PASSWORD"])},
        capture_output=True,
        check=True,
    )
    return len(dumped.stdout)


def _own_session(**options: Any) -> psycopg.Connection[Any]:
    """A database session of the scenario's own, beside Django's, in autocommit mode."""
    database = settings.DATABASES["default"]
    return psycopg.connect(
        host=database["HOST"],
        port=database["PORT"],
        user=database["USER"],
        password=database["PASSWORD"],
        dbname=database["NAME"],
        autocommit=True,
        **options,
    )


def _long_snapshot(run: Run) -> None:
    run.extra["event_updates_before"] = _event_table_updates()
    with _own_session() as reader:
        run.sleep(3)
        opened = run.fault(
            "REPEATABLE READ transaction opened", partial(_open_snapshot, run, reader)
        )
        opened.detail = f"backend {opened.result['pid']}, xmin {opened.result['xmin']}"
        run.verify(
            opened,
            seen=opened.result["xmin"] is not None,
            effect="the session holds a snapshot (backend_xmin)",
        )
        run.sleep(5)
        dumped = run.fault("pg_dump of the whole database", _pg_dump)
        dumped.detail = f"{dumped.result:,} bytes"
        run.verify(dumped, seen=dumped.result > 0, effect="a dump written")
        run.sleep(max(0.0, SNAPSHOT_HOLD_SECONDS - (dumped.ended - opened.started)))
        closed = run.fault(
            "REPEATABLE READ transaction closed",
            partial(_close_snapshot, run, reader, opened.result),
            check=True,
        )
        closed.detail = f"xmin {closed.result['xmin']}"
        run.verify(
            closed,
            seen=closed.result["xmin"] == opened.result["xmin"],
            effect="the snapshot held until the close (the same backend_xmin)",
        )
    run.extra["snapshot"] = {
        "opened": opened.result,
        "closed": closed.result,
        "held_seconds": round(closed.started - opened.ended, 1),
        "dump_bytes": dumped.result,
    }


def _check_long_snapshot(run: Run) -> None:
    """The old snapshot really was held (the session kept its xmin throughout), the relay
    went on publishing under it, and no event row was updated."""
    snapshot = run.extra["snapshot"]
    opened, closed = snapshot["opened"], snapshot["closed"]
    if opened["xmin"] is None or closed["xmin"] != opened["xmin"]:
        run.extra_problems.append(f"the old snapshot was not held throughout: {snapshot}")
    published_while_held = closed["published"] - opened["published"]
    run.extra["published_while_held"] = published_while_held
    if published_while_held <= 0:
        run.extra_problems.append("nothing was published while the old snapshot was held")
    updates = _event_table_updates() - run.extra["event_updates_before"]
    run.extra["event_updates"] = updates
    if updates:
        run.extra_problems.append(f"{updates} updates of outbox_event rows: the log is append-only")


def _hot_key_relay_kills(run: Run) -> None:
    relay = run.processes["relay-1"]
    for number in range(5):
        run.sleep(run.random.uniform(4, 7))
        run.kill(f"SIGKILL relay ({number + 1})", relay)


# How long a kill of relay-takeover waits for a cursor written by a relay that is running.
OWNER_WAIT_SECONDS = 10.0


def _shard_owner(run: Run) -> Managed | None:
    """The relay process that wrote the latest cursor: the owner of the shards (a relay id
    is host:pid:suffix)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relay FROM outbox_relay_cursor ORDER BY id DESC LIMIT 1")
        row = cursor.fetchone()
    if row is None or row[0].count(":") < 2:
        return None
    pid = int(row[0].split(":")[1])
    for process in run.processes.values():
        if process.name.startswith("relay-") and process.pids and process.pids[-1] == pid:
            return process
    return None


def _shard_owner_waited(run: Run) -> Managed | None:
    """The shards' owner, waited for up to OWNER_WAIT_SECONDS: early in the run and right
    after a takeover, the latest cursor is still one a relay no longer running wrote (an
    earlier run's, or the killed relay's before its restart), until the owner's next batch."""
    deadline = time.monotonic() + OWNER_WAIT_SECONDS
    while (owner := _shard_owner(run)) is None and time.monotonic() < deadline:
        run.sleep(0.2)
    return owner


def _relay_takeovers(run: Run) -> None:
    owners: list[str | None] = []
    run.extra["shard_owners_killed"] = owners
    for number in range(8):
        run.sleep(run.random.uniform(3, 5))
        owner = _shard_owner_waited(run)
        owners.append(owner.name if owner else None)
        if owner is None:
            missed = run.fault(f"no shard owner found ({number + 1})")
            run.verify(missed, seen=False, effect="the relay that owns the shards found")
            continue
        run.kill(f"SIGKILL the shards' owner, {owner.name} ({number + 1})", owner)


def _check_takeovers(run: Run) -> None:
    """Every kill struck the relay that owned the shards, and both relays published."""
    owners = run.extra["shard_owners_killed"]
    if None in owners:
        run.extra_problems.append(f"a kill found no shard owner: {owners}")
    pids = {pid: name for name in ("relay-1", "relay-2") for pid in run.processes[name].pids}
    relays = (
        OutboxDelivery.objects.filter(
            event_id__in=OutboxEvent.objects.filter(topic=run.topic).values("id")
        )
        .values_list("relay", flat=True)
        .distinct()
    )
    publishers = {pids.get(int(relay.split(":")[1])) for relay in relays if relay.count(":") >= 2}
    run.extra["publishing_relays"] = sorted(name for name in publishers if name)
    if not {"relay-1", "relay-2"} <= publishers:
        run.extra_problems.append(
            f"the shards did not change hands: only {sorted(map(str, publishers))} published"
        )


# 18: the on-commit nudge, end to end ------------------------------------------------------

# Beat's relay tick in nudge-path: too rare to keep the publish lag under NUDGE_LAG_P99_SECONDS,
# so that only the nudges (publish -> on_commit -> Redis -> the worker's relay task) can.
NUDGE_PATH_RELAY_INTERVAL_SECONDS = 60
NUDGE_LAG_P99_SECONDS = 0.5
NUDGE_WORKER_KILLS = 2
# How long the restarted worker may take to run a relay task again.
WORKER_BACK_SECONDS = 60.0
RELAY_TASK_SUCCEEDED = re.compile(r"Task outbox\.tasks\.relay\[[^]]+\] succeeded in [\d.]+s: (\d+)")
RELAY_TICK_SENT = re.compile(r"Sending due task outbox-relay\b")
WORKER_READY = re.compile(r"@\S+ ready\.")


def _nudge_path_start(run: Run) -> None:
    """Two consumers, a Celery worker, and beat with a relay tick every 60 s; no
    `outbox_relay`. The writers are the runner's own publish() calls, whose transactions nudge
    the worker on commit."""
    run.extra["nudge"] = {
        "on_commit": outbox_settings.NUDGE_ON_COMMIT,
        "min_interval_ms": outbox_settings.NUDGE_MIN_INTERVAL_MS,
        "redis": nudge_redis_url(),
        "beat_relay_interval_seconds": NUDGE_PATH_RELAY_INTERVAL_SECONDS,
    }
    if not outbox_settings.NUDGE_ON_COMMIT:
        run.extra_problems.append('OUTBOX["NUDGE_ON_COMMIT"] is off where the events are written')
    env = {"OUTBOX_RELAY_INTERVAL": str(NUDGE_PATH_RELAY_INTERVAL_SECONDS)}
    _standard(run, relays=0)
    # One pool process: a task in a second one mostly found every shard held by the task
    # running in the first and ended with nothing, and its first send paid for a producer.
    worker = run.add_celery_worker(1, concurrency=1, env=env)
    run.add_celery_beat(1, env=env)
    # The writing starts once a nudge has had the worker publish an event (on a topic of its
    # own): a relay task's first send creates its process's producer, which takes most of a
    # second, and belongs to the worker's start-up, not to the nudge path.
    warmed = _relay_warm_up(
        run,
        within=WORKER_BACK_SECONDS,
        problem=f"no nudged relay task published in {WORKER_BACK_SECONDS:.0f} s of the start",
    )
    run.extra["nudge"]["warm_up_seconds"] = WORKER_BACK_SECONDS if warmed is None else warmed
    run.extra["nudge"]["worker_ready"] = bool(WORKER_READY.search(worker.log_text()))


def _published_event(event_id: Any) -> bool:
    return OutboxDelivery.objects.filter(
        event_id=event_id, outcome=OutboxDelivery.Outcome.PUBLISHED
    ).exists()


def _relay_task_running(worker: Managed) -> bool:
    """Whether a relay task of the worker runs now: a session of its (application_name, which
    its pool inherits) holds shard locks, which a relay run takes first and gives back last."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT EXISTS (
                SELECT 1 FROM pg_locks AS held JOIN pg_stat_activity AS session USING (pid)
                WHERE held.locktype = 'advisory' AND held.granted AND held.objsubid = 2
                  AND held.classid = %s::bigint::oid AND session.application_name = %s
            )
            """,
            [SHARD_LOCK_CLASS, f"{SESSION_NAME_PREFIX}{worker.name}"],
        )
        return bool(cursor.fetchone()[0])


def _log_of_start(process: Managed, start: int) -> str:
    """What the process's start number `start` wrote so far."""
    log = process.log_text()
    marker = log.find(f"--- start {start} at ")
    return "" if marker < 0 else log[marker:]


def _wait_worker_back(worker: Managed, *, starts_before: int) -> float | None:
    """Waits until the worker, started again by the supervisor, has run a relay task that
    published events: the backlog of its outage, up to that task's last batch, is out. Returns
    the seconds it took, or None after WORKER_BACK_SECONDS."""
    began = time.monotonic()
    while time.monotonic() - began < WORKER_BACK_SECONDS:
        start = worker.starts
        log = _log_of_start(worker, start) if start > starts_before else ""
        if any(int(published) for published in RELAY_TASK_SUCCEEDED.findall(log)):
            return time.monotonic() - began
        time.sleep(0.1)
    return None


def _nudge_path_faults(run: Run) -> None:
    worker = run.processes["worker-1"]
    outages: list[dict[str, Any]] = []
    run.extra["worker_outages"] = outages
    for number in range(1, NUDGE_WORKER_KILLS + 1):
        run.sleep(3)
        starts_before = worker.starts
        killed = run.kill(
            f"SIGKILL Celery worker in the middle of a relay task ({number})",
            worker,
            when=partial(_relay_task_running, worker),
            moment="a relay task holding the shards",
        )
        back = run.fault(
            f"Celery worker back, a relay task published ({number})",
            partial(_wait_worker_back, worker, starts_before=starts_before),
        )
        if back.result is None:
            run.extra_problems.append(
                f"the worker ran no relay task within {WORKER_BACK_SECONDS:.0f} s of kill {number}"
            )
        back.detail = f"pid {worker.pids[-1]}, {back.result or 0:.1f} s after the kill"
        result: Killed | None = killed.result
        outages.append(
            {
                "killed_pid": result.pid if result else None,
                "signalled_at": result.signalled_at if result else killed.started_at,
                "back_at": back.ended_at,
                "mid_task": result.aimed if result else None,
            }
        )


def _percentile(values: list[float], fraction: float) -> float | None:
    """The value below which `fraction` of the sorted `values` lie (nearest rank)."""
    if not values:
        return None
    return values[max(0, math.ceil(fraction * len(values)) - 1)]


def _lag_figures(lags: list[float]) -> dict[str, Any]:
    lags = sorted(lags)
    return {
        "events": len(lags),
        **{
            f"{name}_ms": None if value is None else round(value * 1000, 1)
            for name, value in (
                ("p50", _percentile(lags, 0.5)),
                ("p99", _percentile(lags, 0.99)),
                ("max", lags[-1] if lags else None),
            )
        },
    }


def _publish_lags(run: Run) -> list[tuple[datetime, datetime, datetime]]:
    """(created, written, first published) of every event of the run: its outbox row's
    created_at, the created_at of the last event of its transaction (the writer's last
    publish() before the commit: no nudge can come sooner), and the time of its first
    PUBLISHED delivery record."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT event.created_at,
                   max(event.created_at) OVER (PARTITION BY event.txid),
                   min(record.published_at)
            FROM outbox_event AS event
            JOIN outbox_delivery AS record ON record.event_id = event.id
            WHERE event.topic = %s AND record.outcome = 'PUBLISHED'
            GROUP BY event.id, event.created_at, event.txid
            """,
            [run.topic],
        )
        return list(cursor.fetchall())


def _check_nudge_path(run: Run) -> None:
    """Publish lag p99 within NUDGE_LAG_P99_SECONDS for the events that no worker outage held
    back (an event created before the restarted worker's first relay task and published after
    the signal waited for it), the relay tasks came from nudges, and beat sent few ticks."""
    outages = run.extra.get("worker_outages", [])
    steady: list[float] = []
    steady_after_writing: list[float] = []
    held_back: list[float] = []
    every: list[float] = []
    for created, written, first_published in _publish_lags(run):
        lag = (first_published - created).total_seconds()
        every.append(lag)
        waited = any(
            created < outage["back_at"] and first_published > outage["signalled_at"]
            for outage in outages
        )
        (held_back if waited else steady).append(lag)
        if not waited:
            steady_after_writing.append((first_published - written).total_seconds())
    run.extra["publish_lag"] = {
        "all": _lag_figures(every),
        "outside_worker_outages": _lag_figures(steady),
        # The same events' lag from the end of their transaction's writing: what the nudge
        # path adds, without the rest of the writer's own transaction.
        "outside_worker_outages_after_writing": _lag_figures(steady_after_writing),
        "held_back_by_worker_outages": _lag_figures(held_back),
    }
    worker = run.processes["worker-1"].log_text()
    published = [int(n) for n in RELAY_TASK_SUCCEEDED.findall(worker)]
    run.extra["relay_tasks"] = {
        "succeeded": len(published),
        "published": sum(published),
        "beat_ticks_sent": len(RELAY_TICK_SENT.findall(run.processes["beat-1"].log_text())),
    }
    p99 = run.extra["publish_lag"]["outside_worker_outages"]["p99_ms"]
    lag = run.extra["publish_lag"]
    run.extra["summary"] = [
        f"publish lag (created -> first PUBLISHED record) of {lag['all']['events']:,} events: "
        f"p50 {lag['all']['p50_ms']} ms, p99 {lag['all']['p99_ms']} ms, max "
        f"{lag['all']['max_ms']} ms; outside the worker's outages p99 {p99} ms (limit "
        f"{NUDGE_LAG_P99_SECONDS * 1000:.0f} ms), from their transaction's last publish() p50 "
        f"{lag['outside_worker_outages_after_writing']['p50_ms']} ms, p99 "
        f"{lag['outside_worker_outages_after_writing']['p99_ms']} ms; "
        f"{lag['held_back_by_worker_outages']['events']} events held back by them, max "
        f"{lag['held_back_by_worker_outages']['max_ms']} ms",
        f"relay tasks run by the worker: {run.extra['relay_tasks']['succeeded']}, beat relay "
        f"ticks sent: {run.extra['relay_tasks']['beat_ticks_sent']}",
    ]
    if p99 is None or p99 > NUDGE_LAG_P99_SECONDS * 1000:
        run.extra_problems.append(
            f"publish lag p99 {p99} ms outside the worker's outages, over "
            f"{NUDGE_LAG_P99_SECONDS * 1000:.0f} ms"
        )
    if run.extra["relay_tasks"]["succeeded"] <= run.extra["relay_tasks"]["beat_ticks_sent"]:
        run.extra_problems.append(
            f"no more relay tasks than beat ticks: {run.extra['relay_tasks']}"
        )


# 19: a transaction left idle, holding its snapshot, while events flow and retention runs --

# The held transaction is sampled this many times, evenly over the hold.
IDLE_SAMPLES = 10
# What the idle session read: a business table, not the event table (the transaction of
# long-snapshot reads that), so that retention's drops need no lock it holds.
IDLE_READ = "SELECT count(*) FROM scenario_effect"
# The relay's batch read is timed this many times at each sample; the median is kept.
BATCH_READ_PROBES = 5
# The last sample's batch read may take this many times the median of the first half's,
# plus the allowance (a read of a few milliseconds on a busy 2-core machine varies by more
# than the factor).
BATCH_READ_FACTOR = 3.0
BATCH_READ_ALLOWANCE_MS = 10.0
# Retention runs at each sample with this retention instead of OUTBOX["RETENTION_DAYS"]: every
# day that has ended goes once the relay is past its events. A day of events this many days
# old (a hundredth of the run, at least OLD_DAY_MIN_EVENTS), which the relay publishes first,
# is there for it to drop while the transaction is held.
IDLE_RETENTION = timedelta(days=0)
OLD_DAY_AGE_DAYS = 3
OLD_DAY_MIN_EVENTS = 100
DEAD_TUPLES_OF = ("outbox_tick", "outbox_relay_cursor", "outbox_delivery", "inbox_message")


def _old_day_seed(run: Run) -> None:
    """Events of a day past, on a topic of their own, in that day's partition (or the one
    that covers it, such as the partition migration 0014 made of the days before it), as a
    deployment that has run for days holds. The relay publishes them first."""
    day = (timezone.now() - timedelta(days=OLD_DAY_AGE_DAYS)).date()
    covering = [p for p in partitions_read(table="outbox_event") if p.covers(day)]
    partition = covering[0].name if covering else partition_create(table="outbox_event", day=day)
    topic = f"{run.topic}.old-day"
    create_topic(topic)
    count = max(OLD_DAY_MIN_EVENTS, run.events // 100)
    created_at = day_start(day) + timedelta(hours=12)
    OutboxEvent.objects.bulk_create(
        [
            OutboxEvent(
                aggregate_type=AGGREGATE_TYPE,
                aggregate_id=f"old{n % 100}",
                event_type=EVENT_TYPE,
                payload={"n": n},
                topic=topic,
                key=f"old{n % 100}",
                created_at=created_at,
            )
            for n in range(count)
        ],
        batch_size=1000,
    )
    run.extra["old_day"] = {"partition": partition, "events": count}


def _idle_transaction_start(run: Run) -> None:
    # Earlier runs' events were deleted (prepare_database): their dead tuples go first, so
    # that any dead tuple counted during the hold is this run's. The delete's counts are
    # flushed to the statistics before the VACUUM's, which would otherwise add them back.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")
        cursor.execute("VACUUM outbox_event")
    run.extra["dead_tuples_at_start"] = _event_table_figures(run.topic)["dead_tuples"]
    _old_day_seed(run)
    _standard(run)


def _latest_tick() -> Tick:
    tick = tick_latest_after(tick_id=0)
    assert tick is not None  # the event log always holds one (event_log_start_afresh)
    return tick


def _batch_read_ms(since: Tick, until: Tick) -> tuple[float, int]:
    """The relay's batch read (the events committed between two ticks, in position order, up
    to a batch) of the span since `since`, timed: the median of BATCH_READ_PROBES reads in
    milliseconds, and the events one read returned."""
    times, events = [], 0
    for _ in range(BATCH_READ_PROBES):
        began = time.perf_counter()
        found, _ = batch_read(
            cursor=Cursor(shards=ALL_SHARDS, tick_id=since.id),
            since=since,
            until=until,
            limit=outbox_settings.BATCH_SIZE,
            max_bytes=outbox_settings.BATCH_MAX_BYTES,
        )
        events = len(found)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), events


def _event_table_figures(topic: str) -> dict[str, Any]:
    """The event table's size (every partition, indexes included), live events, dead tuples."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            """
            SELECT coalesce(sum(pg_total_relation_size(tree.relid)), 0),
                   coalesce(sum(stats.n_dead_tup), 0), coalesce(sum(stats.n_live_tup), 0)
            FROM pg_partition_tree('outbox_event') AS tree
            LEFT JOIN pg_stat_user_tables AS stats ON stats.relid = tree.relid
            WHERE tree.isleaf
            """
        )
        size, dead, live = cursor.fetchone()
        cursor.execute(
            "SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [list(DEAD_TUPLES_OF)],
        )
        others = dict(cursor.fetchall())
        cursor.execute("SELECT count(*) FROM outbox_event WHERE topic = %s", [topic])
        events = cursor.fetchone()[0]
    return {
        "bytes": int(size),
        "dead_tuples": int(dead),
        "live_tuples": int(live),
        "run_events": int(events),
        "dead_tuples_elsewhere": {name: int(others.get(name, 0)) for name in DEAD_TUPLES_OF},
    }


def _interval_lag(topic: str, since: datetime, until: datetime) -> dict[str, Any]:
    """The publish lag of the run's events first published in [since, until)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT extract(epoch FROM first.published_at - event.created_at)
            FROM outbox_event AS event
            JOIN (
                SELECT event_id, min(published_at) AS published_at FROM outbox_delivery
                WHERE outcome = 'PUBLISHED' GROUP BY event_id
            ) AS first ON first.event_id = event.id
            WHERE event.topic = %s AND first.published_at >= %s AND first.published_at < %s
            """,
            [topic, since, until],
        )
        return _lag_figures([float(lag) for (lag,) in cursor.fetchall()])


def _retention_run() -> dict[str, Any]:
    """Retention as beat's hourly task runs it (outbox.tasks.purge_published), with
    IDLE_RETENTION, timed."""
    began = time.perf_counter()
    went = outbox_event_log_purge(
        older_than=timezone.now() - IDLE_RETENTION,
        batch_size=outbox_settings.RETENTION_BATCH_SIZE,
    )
    return {**went, "seconds": round(time.perf_counter() - began, 2)}


def _idle_sample(run: Run, pid: int, since: Tick, since_at: datetime) -> dict[str, Any]:
    horizon = _session_horizon(pid)
    until = _latest_tick()
    read_ms, read_events = _batch_read_ms(since, until)
    return {
        "at": timezone.now(),
        # What the consumers applied so far: the held snapshot keeps the dead row versions of
        # the inbox's updates, which its look-ups then walk.
        "applied": ScenarioEffect.objects.filter(consumer_group=run.group).count(),
        "state": horizon["state"],
        "xmin": horizon["xmin"],
        "xid": horizon["xid"],
        # Every tick's snapshot starts at or below the held transaction id: the relay's batch
        # reads and ticks walk the event index from there.
        "tick_xmin": until.snapshot.split(":")[0],
        "tick": until,
        "batch_read_ms": round(read_ms, 2),
        "batch_read_events": read_events,
        "lag": _interval_lag(run.topic, since_at, timezone.now()),
        "table": _event_table_figures(run.topic),
        "retention": _retention_run(),
    }


def _idle_transaction(run: Run) -> None:
    hold = run.scenario.writing_seconds(run.events)
    samples: list[dict[str, Any]] = []
    run.extra["idle_samples"] = samples
    with _own_session(application_name=f"{SESSION_NAME_PREFIX}idle-transaction") as idle:
        run.sleep(2)
        opened = run.fault(
            "transaction left idle in transaction (REPEATABLE READ, after a read, holding a "
            "transaction id)",
            partial(_open_snapshot, run, idle, read=IDLE_READ, take_xid=True),
        )
        xmin, xid = opened.result["xmin"], opened.result["xid"]
        opened.detail = f"backend {opened.result['pid']}, xmin {xmin}, xid {xid}"
        run.verify(
            opened,
            seen=xmin is not None and xid is not None,
            effect="the session holds a backend_xmin and a backend_xid",
        )
        since, since_at = _latest_tick(), timezone.now()
        for number in range(1, IDLE_SAMPLES + 1):
            run.sleep(max(0.0, opened.ended + hold * number / IDLE_SAMPLES - time.monotonic()))
            sampled = run.fault(
                f"sample {number}: the idle session, the relay's batch read, the event table, "
                "retention",
                partial(_idle_sample, run, opened.result["pid"], since, since_at),
                check=True,
            )
            sample = sampled.result
            since, since_at = sample.pop("tick"), sample["at"]
            sampled.detail = (
                f"{sample['state']}, xmin {sample['xmin']}, xid {sample['xid']}, tick's xmin "
                f"{sample['tick_xmin']}; batch read {sample['batch_read_ms']} "
                f"ms ({sample['batch_read_events']} events); event table "
                f"{sample['table']['bytes']:,} bytes, {sample['table']['dead_tuples']} dead "
                f"tuples; retention {sample['retention']['partitions']} partitions dropped"
            )
            run.verify(
                sampled,
                seen=(sample["state"], sample["xmin"], sample["xid"])
                == ("idle in transaction", xmin, xid),
                effect=f"pg_stat_activity: the session idle in transaction, backend_xmin {xmin}, "
                f"backend_xid {xid}",
            )
            samples.append(sample)
        closed = run.fault(
            "idle transaction closed",
            partial(_close_snapshot, run, idle, opened.result),
            check=True,
        )
        closed.detail = f"xmin {closed.result['xmin']}, xid {closed.result['xid']}"
        run.verify(
            closed,
            seen=(closed.result["xmin"], closed.result["xid"]) == (xmin, xid),
            effect="the snapshot and the transaction id held until the close (the same "
            "backend_xmin and backend_xid)",
        )
    run.extra["snapshot"] = {
        "opened": opened.result,
        "closed": closed.result,
        "held_seconds": round(closed.started - opened.ended, 1),
    }


def _check_idle_transaction(run: Run) -> None:
    """Events were published while the transaction was held; the event table had no dead
    tuple at any sample; the relay's batch read at the last sample took at most
    BATCH_READ_FACTOR times the first half's median (plus the allowance); retention dropped
    the old day while the transaction was held."""
    samples = run.extra.get("idle_samples", [])
    snapshot = run.extra.get("snapshot")
    if not samples or not snapshot:
        run.extra_problems.append("the idle transaction was not sampled")
        return
    run.extra["published_while_held"] = (
        snapshot["closed"]["published"] - snapshot["opened"]["published"]
    )
    if run.extra["published_while_held"] <= 0:
        run.extra_problems.append("nothing was published while the transaction was held")
    dead = [sample["table"]["dead_tuples"] for sample in samples]
    if any(dead):
        run.extra_problems.append(f"dead tuples in the event table during the hold: {dead}")
    # The first half's median, not the first sample alone: one read of a busy moment would
    # make any bound loose, or too tight.
    first = statistics.median(s["batch_read_ms"] for s in samples[: max(1, len(samples) // 2)])
    last = samples[-1]["batch_read_ms"]
    bound = BATCH_READ_FACTOR * first + BATCH_READ_ALLOWANCE_MS
    run.extra["batch_read_bound_ms"] = round(bound, 2)
    if last > bound:
        run.extra_problems.append(
            f"the relay's batch read took {last} ms at the last sample, over {bound:.1f} ms "
            f"({BATCH_READ_FACTOR:g} x the first half's median {first} ms + "
            f"{BATCH_READ_ALLOWANCE_MS:g})"
        )
    dropped = [
        number for number, sample in enumerate(samples, 1) if sample["retention"]["partitions"] > 0
    ]
    run.extra["old_day"]["dropped_at_samples"] = dropped
    if not dropped:
        run.extra_problems.append(
            f"retention dropped no partition while the transaction was held: {run.extra['old_day']}"
        )
    run.extra["summary"] = [
        f"held {snapshot['held_seconds']} s, {run.extra['published_while_held']:,} events "
        f"published meanwhile; retention dropped {run.extra['old_day']['partition']} at sample "
        f"{dropped[0] if dropped else '-'}; last batch read {last} ms, bound {bound:.1f} ms",
        "sample: batch read ms (events) | publish lag p99 ms | event table MB, dead tuples | "
        "dead tuples of " + ", ".join(DEAD_TUPLES_OF) + " | events applied",
        *(
            f"  {number:2}: {s['batch_read_ms']:7.2f} ({s['batch_read_events']:4}) | "
            f"{s['lag']['p99_ms']} | {s['table']['bytes'] / 1e6:.1f}, {s['table']['dead_tuples']}"
            f" | {', '.join(str(n) for n in s['table']['dead_tuples_elsewhere'].values())}"
            f" | {s['applied']:,}"
            for number, s in enumerate(samples, 1)
        ),
    ]


# 20: writers that take their transaction id before the aggregate's lock ------------------

# Few aggregates (the keys), many writers: each aggregate's row lock has a queue.
LATE_LOCK_KEYS = 6
LATE_LOCK_WRITERS = 12
# A writer's pause (uniform, up to this) between taking its transaction id and asking for the
# aggregate's lock: another writer that starts later may take the lock first. Then, once it
# holds the lock, a pause up to LATE_LOCK_HOLD_SECONDS before its commit, so that writers
# queue behind it; each runs as soon as the one before commits, in the same span of the relay
# mostly (a span is read between two ticks, taken by the relay as it goes).
LATE_LOCK_GAP_SECONDS = 0.02
LATE_LOCK_HOLD_SECONDS = 0.003


def _late_lock_start(run: Run, *, broken_relay: bool = False) -> None:
    """The run's aggregates, each at version 0, then a relay (the real one, or with
    `broken_relay` one that sends each batch in transaction-id order) and two consumers."""
    ScenarioAggregate.objects.bulk_create(
        [ScenarioAggregate(run=run.run_id, key=f"k{index}") for index in range(run.keys)]
    )
    if broken_relay:
        _relay_of_scenario_broken(run, variant="log-relay-txid-order", env={"SCENARIO_BROKEN": "1"})
    else:
        _standard(run)


def _late_lock_write(run: Run, writer: int, seconds: float) -> None:
    """One writer (Scenario.write): its share of the run's events, one transaction each, on an
    aggregate drawn at random. Each transaction takes its transaction id first (as a write to
    another table would), pauses, locks the aggregate's row, increments its version and
    publishes an event carrying it, then commits. The event's position comes from a sequence
    at its insert, under the lock: on each key it follows the versions; the transaction ids
    do not."""
    draw = random.Random(run.random.random() + writer)
    numbers = range(writer, run.events, run.scenario.writers)
    started = time.monotonic()
    for index, number in enumerate(numbers):
        ahead = started + seconds * index / len(numbers) - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        key = f"k{draw.randrange(run.keys)}"
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_current_xact_id()")
            time.sleep(draw.uniform(0, LATE_LOCK_GAP_SECONDS))
            aggregate = ScenarioAggregate.objects.select_for_update().get(run=run.run_id, key=key)
            aggregate.version += 1
            aggregate.save(update_fields=["version"])
            outbox.publish(
                aggregate_type=AGGREGATE_TYPE,
                aggregate_id=key,
                event_type=EVENT_TYPE,
                # "seq" is the version too: the delivery checker's order check, and the
                # consumers' effects, follow it.
                payload={"version": aggregate.version, "seq": aggregate.version, "n": number},
                topic=run.topic,
            )
            time.sleep(draw.uniform(0, LATE_LOCK_HOLD_SECONDS))
        run.committed()


def _visible(txid: int, snapshot: str) -> bool:
    """Whether a transaction committed before `snapshot` (pg_snapshot's text, xmin:xmax:xip):
    pg_visible_in_snapshot for a transaction that did commit."""
    xmin, xmax, running = snapshot.split(":")
    return txid < int(xmin) or (
        txid < int(xmax) and str(txid) not in (running.split(",") if running else [])
    )


def _late_lock_pairs(run: Run) -> dict[str, int]:
    """Of each key's consecutive versions (v, v + 1), the pairs whose transaction ids are in
    the other order (the writer of v + 1 took its id first, and the lock last), and of those
    the pairs that first became visible at the same tick of the relay, so in one span that
    the relay read: a relay sending a span in transaction-id order sends v + 1 first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT snapshot::text FROM outbox_tick ORDER BY id")
        ticks = [snapshot for (snapshot,) in cursor.fetchall()]
        cursor.execute(
            """
            SELECT key, (payload->>'version')::bigint, txid::text FROM outbox_event
            WHERE topic = %s ORDER BY key, 2
            """,
            [run.topic],
        )
        rows = [(key, version, int(txid)) for key, version, txid in cursor.fetchall()]

    def first_tick(txid: int) -> int:
        # The ticks' snapshots only grow (one relay takes them one after the other): the
        # first that sees the transaction is found by bisection.
        return bisect.bisect_left(range(len(ticks)), True, key=lambda i: _visible(txid, ticks[i]))

    pairs = late = in_one_span = 0
    for (key, version, txid), (next_key, next_version, next_txid) in itertools.pairwise(rows):
        if next_key != key or next_version != version + 1:
            continue
        pairs += 1
        if next_txid < txid:
            late += 1
            in_one_span += first_tick(txid) == first_tick(next_txid)
    return {"pairs": pairs, "late_lockers": late, "late_lockers_in_one_span": in_one_span}


def _check_late_lock(run: Run) -> None:
    """Kafka's order of each key is its versions' (the checker's version step, on the whole
    log); the aggregates' versions count every event written; and the fault happened: writers
    of one key committed between the same two ticks in the other order than their
    transaction ids'."""
    log, complete = read_log(topic=run.topic)
    versions = version_check(log)
    run.extra["version_order"] = {**asdict(versions), "log_complete": complete}
    run.extra_problems.extend(versions.problems())
    aggregates = dict(
        ScenarioAggregate.objects.filter(run=run.run_id).values_list("key", "version")
    )
    run.extra["aggregate_versions"] = aggregates
    if sum(aggregates.values()) != run.events:
        run.extra_problems.append(
            f"the aggregates' versions add up to {sum(aggregates.values())}, not the "
            f"{run.events} events written"
        )
    run.extra["late_lock"] = late = _late_lock_pairs(run)
    run.extra["summary"] = [
        f"{late['late_lockers']} of {late['pairs']} consecutive versions of a key written in "
        f"the other order than their transaction ids, {late['late_lockers_in_one_span']} of "
        f"them committed between the same two ticks; in the log: {versions.inversions} version "
        f"inversions, {versions.gaps} gaps over {versions.records} events of {versions.keys} keys"
    ]
    if not late["late_lockers_in_one_span"]:
        run.extra_problems.append(
            "no two writers of a key committed between the same two ticks in the other order "
            f"than their transaction ids: the run proved nothing ({late})"
        )


# The runner's events, written by a scenario's own writers --------------------------------


def _spread_write(
    run: Run,
    writer: int,
    seconds: float,
    *,
    then: Callable[[Run, int, int, int], None] | None = None,
) -> None:
    """One writer (Scenario.write) of the runner's own events: the keys k with k % writers ==
    writer, in order, in transactions as large as the runner's (Run._write), spread over
    `seconds`. Unlike the runner's writers, its last transaction does not wait for the fault
    schedule, which can then act once the writing is over. After each of its commits,
    `then(run, writer, transaction, transactions)` may write more."""
    numbers, size = run.writer_share(writer)
    batches = [numbers[first : first + size] for first in range(0, len(numbers), size)]
    started = time.monotonic()
    for index, batch in enumerate(batches):
        ahead = started + seconds * index / len(batches) - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        run.publish_batch(batch)
        run.committed()
        if then is not None:
            then(run, writer, index, len(batches))


# The writing of quiet-replay and missing-topic: 400 events a second (20,000 in 50 s at full
# size, 2,000 in 5 s in the tests), a pace this 2-core machine carries, so that their publish
# lags compare.
WRITING_SECONDS = 50.0
MIN_WRITING_SECONDS = 5.0


# How long a schedule that acts once the writing is over waits for every event of the run to
# be published and applied.
DELIVERED_WAIT_SECONDS = 120.0


def _delivered(run: Run) -> bool:
    """Every event of the run's topic DONE in the outbox and applied in the group."""
    events = OutboxEvent.objects.filter(topic=run.topic)
    if outbox_events_with_delivery(events).exclude(delivery_status="DONE").exists():
        return False
    applied = ScenarioEffect.objects.filter(consumer_group=run.group)
    return applied.values("event_id").distinct().count() == run.events


def _wait_delivered(run: Run, timeout: float) -> float | None:
    """Seconds from the end of the writing until every event of the run was delivered (as
    _delivered), or None after `timeout`."""
    run.production_done.wait()
    while not _delivered(run):
        if time.monotonic() - run.production_ended > timeout:
            return None
        time.sleep(0.2)
    return time.monotonic() - run.production_ended


def _published_records(
    event_ids: list[Any],
) -> dict[str, list[tuple[datetime, int | None, int | None]]]:
    """Each event's PUBLISHED delivery records, oldest first: (published_at, partition,
    offset)."""
    records: dict[str, list[tuple[datetime, int | None, int | None]]] = {
        str(i): [] for i in event_ids
    }
    rows = (
        OutboxDelivery.objects.filter(
            event_id__in=event_ids, outcome=OutboxDelivery.Outcome.PUBLISHED
        )
        .order_by("id")
        .values_list("event_id", "published_at", "kafka_partition", "kafka_offset")
    )
    for event_id, published_at, partition, offset in rows:
        records[str(event_id)].append((published_at, partition, offset))
    return records


def _latest_tick_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM outbox_tick")
        return int(cursor.fetchone()[0])


# How long the relay may take to start and publish its warm-up event.
RELAY_UP_SECONDS = 60.0
RELAY_UP_PROBLEM = f"the relay published nothing in {RELAY_UP_SECONDS:g} s"


def _relay_warm_up(run: Run, *, within: float, problem: str) -> float | None:
    """Publishes an event on a topic of its own and waits until a relay has published it: the
    relay process has started and created its producer, which takes seconds that belong to
    its start, not to the publish lag of the run's events. Returns the seconds it took (to a
    tenth); None after `within` seconds, with `problem` among the run's problems."""
    warm_up = f"{run.topic}.warm-up"
    create_topic(warm_up)
    with transaction.atomic():
        event = outbox.publish(
            aggregate_type=AGGREGATE_TYPE,
            aggregate_id="warm-up",
            event_type=EVENT_TYPE,
            payload={"warm_up": True},
            topic=warm_up,
        )
    began = time.monotonic()
    while not _published_event(event.id):
        if time.monotonic() - began > within:
            run.extra_problems.append(problem)
            return None
        time.sleep(0.1)
    return round(time.monotonic() - began, 1)


# 21: an operator's replay of delivered events, in a quiet database --------------------------

# Delivered events replayed with their own ids, as the console's replay does: this many one
# at a time, then this many in one bulk call (each on a key of its own).
QUIET_REPLAYS = 5
QUIET_BULK_REPLAYS = 5
# Each replay must be published again (its second PUBLISHED delivery record) within this long
# of its commit.
REPLAY_BOUND_SECONDS = 5.0
# The database is quiet once every event is delivered and applied and the relay has taken no
# tick for this long (a relay takes a tick only when there is something new to read).
QUIET_SECONDS = 2.0
QUIET_WAIT_SECONDS = 30.0
# How long the consumers may take to count the copies as duplicates once they are published.
DUPLICATE_WAIT_SECONDS = 10.0


def _quiet_replay_start(run: Run) -> None:
    """A relay and two consumers; the writing starts once the relay has published a warm-up
    event, so that the writing's publish lag, missing-topic's baseline, leaves out the
    relay's start."""
    _standard(run)
    run.extra["relay_warm_up_seconds"] = _relay_warm_up(
        run, within=RELAY_UP_SECONDS, problem=RELAY_UP_PROBLEM
    )


def _wait_quiet(run: Run) -> dict[str, Any]:
    """Waits until every event is delivered and no tick has been taken for QUIET_SECONDS."""
    delivered = _wait_delivered(run, DELIVERED_WAIT_SECONDS)
    began = time.monotonic()
    tick, since = _latest_tick_id(), time.monotonic()
    while time.monotonic() - since < QUIET_SECONDS:
        if time.monotonic() - began > QUIET_WAIT_SECONDS:
            break
        time.sleep(0.1)
        if (latest := _latest_tick_id()) != tick:
            tick, since = latest, time.monotonic()
    return {
        "delivered_after_writing_seconds": None if delivered is None else round(delivered, 1),
        "quiet": delivered is not None and time.monotonic() - since >= QUIET_SECONDS,
        "tick": tick,
        "event_rows": OutboxEvent.objects.count(),
    }


def _replay(event_ids: list[Any], *, bulk: bool) -> dict[str, Any]:
    """Replays delivered events with their own ids through the repairs service, in one
    transaction as the console does, and reads back in it the held rows the replay wrote (a
    relay cannot send them before the commit)."""
    tick = _latest_tick_id()
    with transaction.atomic():
        if bulk:
            replayed = outbox_events_replay(event_ids=event_ids, new_event_id=False)
        else:
            [event] = OutboxEvent.objects.filter(pk__in=event_ids)
            outbox_event_replay(event=event, new_event_id=False)
            replayed = 1
        held = OutboxHeldEvent.objects.filter(event_id__in=event_ids, attempts=0).count()
    return {
        "events": [str(i) for i in event_ids],
        "replayed": replayed,
        "held": held,
        "committed_at": timezone.now(),
        "tick_before": tick,
    }


def _wait_republished(replay: dict[str, Any]) -> dict[str, float | None]:
    """Waits up to REPLAY_BOUND_SECONDS for a second PUBLISHED delivery record of each
    replayed event; returns each one's delay from the replay's commit in seconds (None: not
    published again in time)."""
    deadline = time.monotonic() + REPLAY_BOUND_SECONDS
    while True:
        records = _published_records(replay["events"])
        if all(len(found) >= 2 for found in records.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return {
        event_id: (found[1][0] - replay["committed_at"]).total_seconds()
        if len(found) >= 2
        else None
        for event_id, found in records.items()
    }


def _duplicates_counted(run: Run, event_ids: list[str]) -> dict[str, int]:
    """The inbox's duplicate count of each event in the run's group."""
    rows = InboxMessage.objects.filter(
        consumer_group=run.group, topic=run.topic, event_id__in=event_ids
    ).values_list("event_id", "duplicate_count")
    return dict(rows)


def _wait_duplicates(run: Run, event_ids: list[str]) -> dict[str, int]:
    deadline = time.monotonic() + DUPLICATE_WAIT_SECONDS
    while True:
        counted = _duplicates_counted(run, event_ids)
        done = all(counted.get(event_id, 0) >= 1 for event_id in event_ids)
        if done or time.monotonic() > deadline:
            return counted
        time.sleep(0.1)


def _quiet_replays(run: Run) -> None:
    replays: list[dict[str, Any]] = []
    run.extra["replays"] = replays
    quiet = run.fault(
        f"every event delivered and applied, no tick for {QUIET_SECONDS:g} s (the relay idle)",
        partial(_wait_quiet, run),
        check=True,
    )
    quiet.detail = (
        f"delivered {quiet.result['delivered_after_writing_seconds']} s after the writing, "
        f"latest tick {quiet.result['tick']}, {quiet.result['event_rows']} event rows"
    )
    run.verify(quiet, seen=quiet.result["quiet"], effect="a quiet database")
    run.extra["quiet"] = quiet.result
    if not quiet.result["quiet"]:
        return
    # Delivered events of distinct keys, drawn at random.
    by_key: dict[str, list[Any]] = {}
    for event_id, key in OutboxEvent.objects.filter(topic=run.topic).values_list("id", "key"):
        by_key.setdefault(key, []).append(event_id)
    keys = run.random.sample(sorted(by_key), QUIET_REPLAYS + QUIET_BULK_REPLAYS)
    chosen = [run.random.choice(by_key[key]) for key in keys]
    groups = [[event_id] for event_id in chosen[:QUIET_REPLAYS]] + [chosen[QUIET_REPLAYS:]]
    for number, group in enumerate(groups, 1):
        bulk = len(group) > 1
        what = (
            f"bulk replay of {len(group)} delivered events with their own ids"
            if bulk
            else f"replay of delivered event {group[0]} with its own id ({number})"
        )
        replayed = run.fault(what, partial(_replay, group, bulk=bulk))
        replay = replayed.result
        replayed.detail = (
            f"{replay['replayed']} replayed, {replay['held']} held rows in its transaction"
        )
        run.verify(
            replayed,
            seen=replay["replayed"] == replay["held"] == len(group),
            effect=f"{len(group)} held rows written by the replay's transaction",
        )
        published = run.fault(
            f"published again within {REPLAY_BOUND_SECONDS:g} s ({number})",
            partial(_wait_republished, replay),
            check=True,
        )
        delays = published.result
        published.detail = ", ".join(
            "not sent" if delay is None else f"{delay * 1000:.0f} ms" for delay in delays.values()
        )
        run.verify(
            published,
            seen=all(d is not None and d <= REPLAY_BOUND_SECONDS for d in delays.values()),
            effect=f"a second PUBLISHED delivery record of each within {REPLAY_BOUND_SECONDS:g} s",
        )
        replays.append(
            {
                **replay,
                "committed_at": replay["committed_at"].isoformat(),
                "ticks_taken": _latest_tick_id() - replay["tick_before"],
                "delays": delays,
            }
        )
    replayed_ids = [event_id for replay in replays for event_id in replay["events"]]
    counted = run.fault(
        "the inbox counted each copy as a duplicate",
        partial(_wait_duplicates, run, replayed_ids),
        check=True,
    )
    counted.detail = f"duplicate counts {sorted(counted.result.values())}"
    run.verify(
        counted,
        seen=all(counted.result.get(event_id, 0) >= 1 for event_id in replayed_ids),
        effect=f"each replayed event's inbox row counted a duplicate within "
        f"{DUPLICATE_WAIT_SECONDS:g} s",
    )
    run.extra["duplicate_counts"] = counted.result
    run.extra["event_rows_after_replays"] = OutboxEvent.objects.count()


def _second_copy_after_first(places: list[tuple[int | None, int | None]]) -> bool:
    """Two (partition, offset) records of one event, the second later in the same partition."""
    if len(places) != 2:
        return False
    (partition, offset), (again, later) = places
    return partition == again and offset is not None and later is not None and offset < later


def _check_quiet_replay(run: Run) -> None:
    """Each replayed event has two PUBLISHED delivery records, at two offsets of its
    partition, and two copies in the log; the inbox counted the second as a duplicate (the
    checker counts no duplicate effect); and no event row was written from the quiet moment
    on: only the replays could wake the relay."""
    replays = run.extra.get("replays", [])
    replayed_ids = [event_id for replay in replays for event_id in replay["events"]]
    if len(replayed_ids) != QUIET_REPLAYS + QUIET_BULK_REPLAYS:
        run.extra_problems.append(
            f"{len(replayed_ids)} events replayed, {QUIET_REPLAYS + QUIET_BULK_REPLAYS} planned"
        )
        return
    records = _published_records(replayed_ids)
    run.extra["replay_records"] = {
        event_id: [f"{partition}:{offset}" for _, partition, offset in found]
        for event_id, found in records.items()
    }
    once = {
        event_id: places
        for event_id, found in records.items()
        if not _second_copy_after_first(places := [(p, o) for _, p, o in found])
    }
    if once:
        run.extra_problems.append(
            f"{len(once)} of {len(records)} replayed events without two PUBLISHED records, the "
            f"second later in the same partition: {once}"
        )
    log, complete = read_log(topic=run.topic)
    copies = Counter(record.event_id for record in log if record.event_id in records)
    run.extra["replay_copies_in_log"] = dict(copies)
    not_twice = [event_id for event_id in replayed_ids if copies[event_id] != 2]
    if not complete or not_twice:
        run.extra_problems.append(
            f"{len(not_twice)} replayed events not twice in the Kafka log "
            f"(copies {sorted(copies[event_id] for event_id in not_twice)}; the log read to its "
            f"end: {complete})"
        )
    counted = _duplicates_counted(run, replayed_ids)
    uncounted = [event_id for event_id in replayed_ids if counted.get(event_id, 0) < 1]
    if uncounted:
        run.extra_problems.append(
            f"{len(uncounted)} replayed events whose copy the inbox did not count as a duplicate"
        )
    before = run.extra.get("quiet", {}).get("event_rows")
    after = OutboxEvent.objects.count()
    run.extra["event_rows_written_after_quiet"] = None if before is None else after - before
    if before is None or after != before:
        run.extra_problems.append(
            f"event rows written after the database went quiet: {before} then {after}"
        )
    # The same writers as missing-topic's, at the same pace, without a missing topic.
    run.extra["publish_lag"] = _lag_figures(
        [(published - created).total_seconds() for created, _, published in _publish_lags(run)]
    )
    delays = sorted(d for replay in replays for d in replay["delays"].values() if d is not None)
    run.extra["replay_delay"] = _lag_figures(delays)
    figures = run.extra["replay_delay"]
    run.extra["summary"] = [
        f"{len(replayed_ids)} delivered events replayed with their own ids in a quiet database "
        f"({QUIET_REPLAYS} one at a time, {QUIET_BULK_REPLAYS} in one bulk): published again "
        f"{figures['events']} of them, from the replay's commit p50 {figures['p50_ms']} ms, max "
        f"{figures['max_ms']} ms (bound {REPLAY_BOUND_SECONDS * 1000:.0f} ms); ticks the relay "
        f"took for each replay {[replay['ticks_taken'] for replay in replays]}; inbox duplicate "
        f"counts {sorted(counted.values())}",
        f"publish lag of the writing (created -> first PUBLISHED record): p50 "
        f"{run.extra['publish_lag']['p50_ms']} ms, p99 {run.extra['publish_lag']['p99_ms']} ms, "
        f"max {run.extra['publish_lag']['max_ms']} ms",
    ]


# 22: events on a topic that does not exist, beside events that flow ----------------------

# The relay's producer asks for no topic to be created on demand (the isolated cluster would
# create one: auto.create.topics.enable=true), and learns within 1 s that a topic is missing:
# a send to it fails with UNKNOWN_TOPIC_OR_PART, as on a cluster that creates none.
MISSING_TOPIC_PRODUCER_CONFIG = (
    "allow.auto.create.topics=false,topic.metadata.propagation.max.ms=1000"
)
MISSING_TOPIC_KEYS = 5
MISSING_TOPIC_EVENTS_PER_KEY = 4
# The run's own topic must be delivered within this long of the end of the writing while the
# missing topic's events are held (a batch of them counted as a Kafka outage would be read
# again and again, and hold every event after it until the topic exists), and its publish lag
# p99 stay within the bound. The baseline is quiet-replay's writing (the same writers at the
# same pace, no missing topic): p99 0.69-1.14 s at the tests' size on the shared 2-core
# machine (docs/scenarios.md); the bound leaves room for a busy machine; a stall until the
# topic exists takes tens of seconds.
MISSING_TOPIC_FLOW_SECONDS = 30.0
MISSING_TOPIC_LAG_P99_SECONDS = 3.0
# How long the writing waits for the first failure of each key's first event, and the check
# of the held events for the first failure of each head.
MISSING_HEADS_WAIT_SECONDS = 15.0
# Once the topic exists and the held events are retried, they must all be published within.
MISSING_TOPIC_RETRY_SECONDS = 30.0


def _missing_topic(run: Run) -> str:
    return f"{run.topic}.missing"


def _missing_topic_start(run: Run) -> None:
    """The relay, whose producer asks for no topic on demand, and two consumers. Once the
    relay has published a warm-up event, the first event of each of the missing topic's keys
    is written in one transaction, with nothing else to read: the relay's batch holds only
    them, and nothing of it can go. The writing starts once each of them has failed (up to
    MISSING_HEADS_WAIT_SECONDS)."""
    run.add_relay(1, env={"OUTBOX_PRODUCER_CONFIG": MISSING_TOPIC_PRODUCER_CONFIG})
    for index in (1, 2):
        run.add_consumer(index)
    state: dict[str, Any] = {"topic": _missing_topic(run)}
    run.extra["missing_topic"] = state
    state["relay_warm_up_seconds"] = _relay_warm_up(
        run, within=RELAY_UP_SECONDS, problem=RELAY_UP_PROBLEM
    )
    with transaction.atomic():
        for number in range(MISSING_TOPIC_KEYS):
            _publish_missing(run, number)
    began = time.monotonic()
    while time.monotonic() - began < MISSING_HEADS_WAIT_SECONDS:
        if _missing_heads_failed(run) == MISSING_TOPIC_KEYS:
            state["heads_failed_before_writing_seconds"] = round(time.monotonic() - began, 1)
            break
        time.sleep(0.1)


def _publish_missing(run: Run, number: int) -> None:
    """The missing topic's event `number`, on key m{number % MISSING_TOPIC_KEYS}."""
    _publish_numbered(_missing_topic(run), "m", MISSING_TOPIC_KEYS, number)


def _publish_numbered(topic: str, key_prefix: str, keys: int, number: int) -> None:
    """Event `number` of a topic beside the run's, on key {key_prefix}{number % keys}, with
    its place among its key's events in payload['seq'] (the checker's order per key)."""
    key = f"{key_prefix}{number % keys}"
    outbox.publish(
        aggregate_type=AGGREGATE_TYPE,
        aggregate_id=key,
        event_type=EVENT_TYPE,
        payload={"seq": number // keys, "n": number, "key": key},
        topic=topic,
    )


def _missing_heads_failed(run: Run) -> int:
    """The missing topic's events with a FAILED delivery record."""
    return (
        OutboxDelivery.objects.filter(
            event_id__in=OutboxEvent.objects.filter(topic=_missing_topic(run)).values("id"),
            outcome=OutboxDelivery.Outcome.FAILED,
        )
        .values("event_id")
        .distinct()
        .count()
    )


def _missing_topic_events(run: Run, writer: int, index: int, transactions: int) -> None:
    """The rest of the missing topic's events, after the first of each key, written by
    writer 0 after its transactions, spread over them, each in a transaction of its own (a
    service whose topic was never created), while the run's events flow."""
    if writer:
        return
    first = MISSING_TOPIC_KEYS
    rest = MISSING_TOPIC_KEYS * MISSING_TOPIC_EVENTS_PER_KEY - first
    for number in range(
        first - (-index * rest // transactions), first - (-(index + 1) * rest // transactions)
    ):
        with transaction.atomic():
            _publish_missing(run, number)


def _topic_exists(topic: str) -> bool:
    # Every topic's metadata, not this one's: a request naming a missing topic may create it.
    return topic in faults.admin().list_topics(timeout=30).topics


# The missing topic's held events, in their key's order, with each one's FAILED delivery
# records counted in the same statement (one snapshot: a relay's retry writes its record and
# the head's attempts in one transaction).
_HELD_WITH_FAILURES_SQL = """
SELECT held.event_id::text, held.key, held.attempts, held.last_error,
       (SELECT count(*) FROM outbox_delivery AS record
        WHERE record.event_id = held.event_id AND record.outcome = 'FAILED')
FROM outbox_held_event AS held WHERE held.topic = %s ORDER BY held.position
"""


def _missing_topic_held(run: Run) -> dict[str, Any]:
    """The missing topic's events as the relay left them: held rows, each key's head (its
    first event) failed with the cluster's answer, each of its FAILED delivery records one of
    its held attempts, nothing published; waited for up to MISSING_HEADS_WAIT_SECONDS for
    every head's first failure."""
    topic = _missing_topic(run)
    deadline = time.monotonic() + MISSING_HEADS_WAIT_SECONDS
    while True:
        with connection.cursor() as cursor:
            cursor.execute(_HELD_WITH_FAILURES_SQL, [topic])
            held = cursor.fetchall()
        heads: dict[str, dict[str, Any]] = {}
        for event_id, key, attempts, last_error, failed_records in held:
            heads.setdefault(
                key,
                {
                    "event_id": event_id,
                    "attempts": attempts,
                    "failed_records": failed_records,
                    "last_error": last_error,
                },
            )
        failed = all(head["attempts"] >= 1 for head in heads.values())
        if (len(heads) == MISSING_TOPIC_KEYS and failed) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    events = OutboxEvent.objects.filter(topic=topic)
    first: dict[str, str] = {}
    for event_id, key in events.order_by("position").values_list("id", "key"):
        first.setdefault(key, str(event_id))
    return {
        "events": events.count(),
        "held": len(held),
        "heads": {
            key: {**head, "first_event": head["event_id"] == first.get(key)}
            for key, head in sorted(heads.items())
        },
        "published": OutboxDelivery.objects.filter(
            event_id__in=events.values("id"), outcome=OutboxDelivery.Outcome.PUBLISHED
        ).count(),
        "topic_exists": _topic_exists(topic),
    }


def _held_as_expected(state: dict[str, Any]) -> bool:
    """Every event held; each key's head is its first event, failed with UNKNOWN_TOPIC, and
    each of its failures was an attempt of the held head (a failure counted as an outage of
    the batch records a FAILED delivery record and holds nothing); nothing published; the
    topic still missing."""
    heads = state["heads"]
    return (
        state["events"] == state["held"] == MISSING_TOPIC_KEYS * MISSING_TOPIC_EVENTS_PER_KEY
        and len(heads) == MISSING_TOPIC_KEYS
        and all(
            head["first_event"]
            and head["attempts"] >= 1
            and head["failed_records"] == head["attempts"]
            and "UNKNOWN_TOPIC" in head["last_error"]
            for head in heads.values()
        )
        and state["published"] == 0
        and not state["topic_exists"]
    )


def _missing_topic_retry(run: Run) -> int:
    """Retries the missing topic's held events through the repairs service, in one
    transaction as the console's bulk retry does."""
    event_ids = list(
        OutboxEvent.objects.filter(topic=_missing_topic(run)).values_list("id", flat=True)
    )
    with transaction.atomic():
        return outbox_events_retry(event_ids=event_ids)


def _wait_topic_published(topic: str, timeout: float) -> float | None:
    """Seconds until every event of `topic` has a PUBLISHED delivery record and none is
    held, or None after `timeout`."""
    began = time.monotonic()
    events = OutboxEvent.objects.filter(topic=topic)
    while time.monotonic() - began < timeout:
        published = (
            OutboxDelivery.objects.filter(
                event_id__in=events.values("id"), outcome=OutboxDelivery.Outcome.PUBLISHED
            )
            .values("event_id")
            .distinct()
            .count()
        )
        if published == events.count() and not OutboxHeldEvent.objects.filter(topic=topic).exists():
            return time.monotonic() - began
        time.sleep(0.2)
    return None


def _missing_topic_faults(run: Run) -> None:
    state = run.extra["missing_topic"]
    flowed = run.fault(
        f"the run's topic delivered within {MISSING_TOPIC_FLOW_SECONDS:g} s of the writing",
        partial(_wait_delivered, run, MISSING_TOPIC_FLOW_SECONDS),
        check=True,
    )
    flowed.detail = "not delivered" if flowed.result is None else f"{flowed.result:.1f} s"
    run.verify(
        flowed,
        seen=flowed.result is not None,
        effect="every event of the run's topic published and applied",
    )
    state["delivered_after_writing_seconds"] = (
        None if flowed.result is None else round(flowed.result, 1)
    )
    held = run.fault(
        "the missing topic's events held", partial(_missing_topic_held, run), check=True
    )
    state["held"] = held.result
    held.detail = (
        f"{held.result['held']} of {held.result['events']} held, heads' attempts "
        f"{[head['attempts'] for head in held.result['heads'].values()]} and FAILED records "
        f"{[head['failed_records'] for head in held.result['heads'].values()]}, "
        f"{held.result['published']} published, topic exists: {held.result['topic_exists']}"
    )
    run.verify(
        held,
        seen=_held_as_expected(held.result),
        effect=f"every event of the missing topic held; each of its {MISSING_TOPIC_KEYS} keys' "
        "first event failed with UNKNOWN_TOPIC, each failure one of its held attempts; none "
        "published; the topic still missing",
    )
    created = run.fault(
        f"topic {_missing_topic(run)} created", partial(create_topic, _missing_topic(run))
    )
    run.verify(
        created,
        seen=_topic_exists(_missing_topic(run)),
        effect="the topic in the cluster's metadata",
    )
    retried = run.fault(
        "the held events retried through the repairs service (outbox_events_retry)",
        partial(_missing_topic_retry, run),
    )
    retried.detail = f"{retried.result} changed"
    state["retried"] = retried.result
    run.verify(retried, seen=retried.result > 0, effect="held heads made due")
    arrived = run.fault(
        f"the missing topic's events published within {MISSING_TOPIC_RETRY_SECONDS:g} s",
        partial(_wait_topic_published, _missing_topic(run), MISSING_TOPIC_RETRY_SECONDS),
        check=True,
    )
    arrived.detail = "not all" if arrived.result is None else f"{arrived.result:.1f} s"
    state["published_after_retry_seconds"] = (
        None if arrived.result is None else round(arrived.result, 1)
    )
    run.verify(
        arrived,
        seen=arrived.result is not None,
        effect="a PUBLISHED delivery record of each, none held",
    )


def _run_topic_lag_checked(run: Run, bound: float) -> dict[str, Any]:
    """The publish lag of the run's events (created -> first PUBLISHED record); a p99 over
    `bound` seconds, or an event without a record, is a problem of the run."""
    lags = sorted(
        (published - created).total_seconds() for created, _, published in _publish_lags(run)
    )
    lag = _lag_figures(lags)
    p99 = lag["p99_ms"]
    if lag["events"] != run.events or p99 is None or p99 > bound * 1000:
        run.extra_problems.append(
            f"publish lag of the run's topic p99 {lag['p99_ms']} ms over {lag['events']} events, "
            f"bound {bound * 1000:.0f} ms"
        )
    return lag


def _topic_log_checked(run: Run, topic: str, what: str) -> dict[str, Any]:
    """The delivery checker's log checks on a topic beside the run's, whose events no group
    consumes: each event in the log, once, in order per key. Its problems, or an event not in
    the log, are problems of the run (saying `what`)."""
    log, complete = read_log(topic=topic) if _topic_exists(topic) else ([], False)
    report = check(
        topic=topic,
        outbox=load_outbox(topic=topic),
        log=log,
        inbox={},
        effects={},
        log_complete=complete,
    )
    if report.problems() or report.log_records < report.events:
        run.extra_problems.append(f"{what}: {report.format()}")
    return {
        "events": report.events,
        "log_records": report.log_records,
        "log_duplicates": report.log_duplicates,
        "problems": report.problems(),
    }


def _check_missing_topic(run: Run) -> None:
    """The run's topic flowed without a stall (its publish lag p99 within the bound); the
    missing topic's events, once the topic existed and they were retried, are all in its log,
    in order per key, nothing stuck (the delivery checker's log checks on that topic)."""
    state = run.extra["missing_topic"]
    state["publish_lag"] = lag = _run_topic_lag_checked(run, MISSING_TOPIC_LAG_P99_SECONDS)
    report = _topic_log_checked(run, _missing_topic(run), "the missing topic after its retry")
    state["after_retry"] = report
    held = state.get("held", {})
    heads: dict[str, dict[str, Any]] = held.get("heads", {})
    example = next(iter(heads.values()), {}).get("last_error", "-")
    run.extra["summary"] = [
        f"run's topic: {run.events:,} events delivered "
        f"{state.get('delivered_after_writing_seconds')} s after the writing, publish lag "
        f"p50 {lag['p50_ms']} ms, p99 {lag['p99_ms']} ms "
        f"(bound {MISSING_TOPIC_LAG_P99_SECONDS * 1000:.0f} ms), max {lag['max_ms']} ms",
        f"missing topic: {held.get('held')} of "
        f"{MISSING_TOPIC_KEYS * MISSING_TOPIC_EVENTS_PER_KEY} events held, heads' attempts "
        f"{[head['attempts'] for head in heads.values()]}, e.g. "
        f"{example!r}; after the topic's creation "
        f"and the retry ({state.get('retried')} heads): {report['log_records']} records in its "
        "log "
        f"in {state.get('published_after_retry_seconds')} s",
    ]


# 23: the relay's user may no longer write one topic, beside topics that flow ---------------

# The denied topic's events: ACL_DENIED_KEYS keys, the first event of each written while the
# relay's user may write the topic, the rest once its WRITE permission is gone, each in a
# transaction of its own, ACL_DENIED_WRITE_INTERVAL_SECONDS apart, while the run's events flow.
ACL_DENIED_KEYS = 5
ACL_DENIED_EVENTS_PER_KEY = 8
ACL_DENIED_WRITE_INTERVAL_SECONDS = 0.1
# The run's events are written over missing-topic's 50 s at full size and never less than
# this: the denial (ACL_DENIED_SECONDS after the first events of the denied topic flowed) falls
# inside the writing at every size.
ACL_DENIED_MIN_WRITING_SECONDS = 15.0
# How long the permission stays away: each head is tried again a few times meanwhile (the
# relay's backoff from RETRY_BASE_SECONDS, 1 s, doubling).
ACL_DENIED_SECONDS = 6.0
# How long the checks wait for the first events' publication and for each key's refusal.
ACL_DENIED_WAIT_SECONDS = 15.0
# Once the permission is back, every held event must be published by the relay's own
# retries within this long: a head's next try comes within its backoff (4 s after its third
# attempt, 8 s after its fourth, with jitter); no operator acts.
ACL_RESTORED_WAIT_SECONDS = 45.0
# The run's topic flows as in missing-topic: the same writing, the same bound.
ACL_DENIED_LAG_P99_SECONDS = MISSING_TOPIC_LAG_P99_SECONDS
# The authorizer's answer as the relay records it (librdkafka's name of Kafka's error).
TOPIC_AUTHORIZATION_FAILED = "TOPIC_AUTHORIZATION_FAILED"


def _denied_topic(run: Run) -> str:
    return f"{run.topic}.denied"


def _relay_user(run: Run) -> str:
    return f"relay-{run.run_id}"


def _group_user(run: Run) -> str:
    return f"group-{run.run_id}"


def _denied_write(run: Run) -> AclBinding:
    """The relay's user's permission to write the denied topic: the fault takes it away."""
    return allowed(_relay_user(run), ResourceType.TOPIC, _denied_topic(run), AclOperation.WRITE)


def _acl_denied_start(run: Run) -> None:
    """The relay and two consumers through the cluster's secured listener (TLS, SCRAM), each
    role a user of its own whose ACLs allow only its part: the relay's user writes the run's
    topic, the denied topic (created here) and the warm-up topic; the group's user reads the
    run's topic in the run's group. The writing starts once the relay has published a warm-up
    event."""
    secured = faults.secured_kafka()
    relay, group = secured.user(_relay_user(run)), secured.user(_group_user(run))
    create_topic(_denied_topic(run))
    for topic in (f"{run.topic}.warm-up", run.topic, _denied_topic(run)):
        secured.allow(relay, ResourceType.TOPIC, topic, *WRITER)
    secured.allow(group, ResourceType.TOPIC, run.topic, *READER)
    secured.allow(group, ResourceType.GROUP, run.group, AclOperation.READ)
    run.add_relay(1, env=secured.client_environment(relay))
    for index in (1, 2):
        run.add_consumer(index, env=secured.client_environment(group))
    state: dict[str, Any] = {"topic": _denied_topic(run), "relay_user": relay, "group_user": group}
    run.extra["acl_denied"] = state
    state["relay_warm_up_seconds"] = _relay_warm_up(
        run, within=RELAY_UP_SECONDS, problem=RELAY_UP_PROBLEM
    )


def _publish_denied(run: Run, numbers: range, *, interval: float = 0.0) -> None:
    """The denied topic's events `numbers`: in one transaction, or with `interval`, each in a
    transaction of its own that far apart."""
    if not interval:
        with transaction.atomic():
            for number in numbers:
                _publish_numbered(_denied_topic(run), "d", ACL_DENIED_KEYS, number)
        return
    for number in numbers:
        with transaction.atomic():
            _publish_numbered(_denied_topic(run), "d", ACL_DENIED_KEYS, number)
        time.sleep(interval)


def _events_published(topic: str, *, since: datetime | None = None) -> int:
    """The events of `topic` with a PUBLISHED delivery record (one published at `since` or
    later)."""
    records = OutboxDelivery.objects.filter(
        event_id__in=OutboxEvent.objects.filter(topic=topic).values("id"),
        outcome=OutboxDelivery.Outcome.PUBLISHED,
    )
    if since is not None:
        records = records.filter(published_at__gte=since)
    return records.values("event_id").distinct().count()


def _acl_denied_first_published(run: Run) -> float | None:
    """Writes the first event of each of the denied topic's keys; seconds until all are
    published, or None after ACL_DENIED_WAIT_SECONDS."""
    _publish_denied(run, range(ACL_DENIED_KEYS))
    began = time.monotonic()
    while _events_published(_denied_topic(run)) < ACL_DENIED_KEYS:
        if time.monotonic() - began > ACL_DENIED_WAIT_SECONDS:
            return None
        time.sleep(0.1)
    return time.monotonic() - began


def _acl_denied_held(run: Run, *, since: datetime) -> dict[str, Any]:
    """The denied topic's keys as the console lists the held ones (outbox_quarantined_keys),
    waited for until each has a head tried at least once and refused by the authorizer (up to
    ACL_DENIED_WAIT_SECONDS); and what was published of each topic since the permission went."""
    topic = _denied_topic(run)
    deadline = time.monotonic() + ACL_DENIED_WAIT_SECONDS
    while True:
        heads: dict[str, dict[str, Any]] = {
            key.key: {
                "event_id": key.blocking_event_id,
                "status": key.blocking_status,
                "attempts": key.blocking_attempts,
                "error": key.blocking_error,
                "waiting": key.waiting_events,
            }
            for key in outbox_quarantined_keys()
            if key.topic == topic
        }
        refused = [
            head
            for head in heads.values()
            if head["attempts"] >= 1 and TOPIC_AUTHORIZATION_FAILED in head["error"]
        ]
        if len(refused) == ACL_DENIED_KEYS or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {
        "heads": dict(sorted(heads.items())),
        "refused": len(refused),
        "run_topic_published_since": _events_published(run.topic, since=since),
        "denied_published_since": _events_published(topic, since=since),
    }


def _acl_denied_faults(run: Run) -> None:
    state = run.extra["acl_denied"]
    secured = faults.secured_kafka()
    topic, write = _denied_topic(run), _denied_write(run)
    first = run.fault(
        f"the first event of each of {topic}'s {ACL_DENIED_KEYS} keys published",
        partial(_acl_denied_first_published, run),
        check=True,
    )
    first.detail = "not all" if first.result is None else f"{first.result:.1f} s"
    run.verify(first, seen=first.result is not None, effect="a PUBLISHED delivery record of each")
    revoked = run.fault(
        f"WRITE on {topic} taken from {state['relay_user']}", partial(secured.revoke, [write])
    )
    run.verify(
        revoked,
        seen=revoked.result == 1 and not secured.granted(write, expected=False),
        effect="the ACL deleted, no longer in the cluster",
    )
    rest = range(ACL_DENIED_KEYS, ACL_DENIED_KEYS * ACL_DENIED_EVENTS_PER_KEY)
    _publish_denied(run, rest, interval=ACL_DENIED_WRITE_INTERVAL_SECONDS)
    held = run.fault(
        f"each key of {topic} held, refused by the authorizer, as the console lists them",
        partial(_acl_denied_held, run, since=revoked.started_at),
        check=True,
    )
    state["held"] = held.result
    held.detail = (
        f"{held.result['refused']} of {ACL_DENIED_KEYS} keys' heads refused, attempts "
        f"{[head['attempts'] for head in held.result['heads'].values()]}; published since the "
        f"ACL went: {held.result['run_topic_published_since']} of the run's events, "
        f"{held.result['denied_published_since']} of {topic}"
    )
    run.verify(
        held,
        seen=held.result["refused"] == ACL_DENIED_KEYS
        and held.result["run_topic_published_since"] > 0,
        effect=f"every key of the topic held, its head tried and refused with "
        f"{TOPIC_AUTHORIZATION_FAILED}; the run's events published meanwhile",
    )
    time.sleep(max(0.0, ACL_DENIED_SECONDS - (time.monotonic() - revoked.started)))
    restored = run.fault(
        f"WRITE on {topic} given back to {state['relay_user']}", partial(secured.grant, [write])
    )
    run.verify(restored, seen=secured.granted(write), effect="the ACL in the cluster")
    arrived = run.fault(
        f"{topic}'s events published by the relay's own retries within "
        f"{ACL_RESTORED_WAIT_SECONDS:g} s",
        partial(_wait_topic_published, topic, ACL_RESTORED_WAIT_SECONDS),
        check=True,
    )
    arrived.detail = "not all" if arrived.result is None else f"{arrived.result:.1f} s"
    state["published_after_restore_seconds"] = (
        None if arrived.result is None else round(arrived.result, 1)
    )
    run.verify(
        arrived,
        seen=arrived.result is not None,
        effect="a PUBLISHED delivery record of each, none held",
    )


def _check_acl_denied(run: Run) -> None:
    """The run's topic flowed without a stall (its publish lag p99 within the bound); the
    denied topic's events are all in its log once allowed again, once each, in order per key
    (the delivery checker's log checks on that topic)."""
    state = run.extra["acl_denied"]
    state["publish_lag"] = lag = _run_topic_lag_checked(run, ACL_DENIED_LAG_P99_SECONDS)
    report = _topic_log_checked(run, _denied_topic(run), "the denied topic once allowed again")
    state["after_restore"] = report
    held = state.get("held", {})
    heads: dict[str, dict[str, Any]] = held.get("heads", {})
    example = next(iter(heads.values()), {}).get("error", "-")
    run.extra["summary"] = [
        f"run's topic: {run.events:,} events, publish lag p50 {lag['p50_ms']} ms, p99 "
        f"{lag['p99_ms']} ms (bound {ACL_DENIED_LAG_P99_SECONDS * 1000:.0f} ms), max "
        f"{lag['max_ms']} ms; {held.get('run_topic_published_since')} of them published while "
        "denied",
        f"denied topic: {held.get('refused')} of {ACL_DENIED_KEYS} keys held, heads' attempts "
        f"{[head['attempts'] for head in heads.values()]}, e.g. {example!r}; once allowed "
        f"again: {report['log_records']} records of {report['events']} events in its log in "
        f"{state.get('published_after_restore_seconds')} s",
    ]


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


def _broken_log_relay(run: Run) -> None:
    run.add(
        "relay-1",
        [
            sys.executable,
            "manage.py",
            "scenario_broken",
            "log-relay-cursor-first",
            "--slot",
            run.run_id,
        ],
        first_starts=2,
        # Records wait in the producer's queue, so the kill before the flush loses them.
        first_starts_env={"SCENARIO_BROKEN": "1", "OUTBOX_PRODUCER_LINGER_MS": "20000"},
    )
    for index in (1, 2):
        run.add_consumer(index)


# The keys of the refused-event run and of the broken event-log relays': few, so that a batch
# holds several events of one key (a reversed batch then inverts them) and a held key holds
# many events.
FEW_KEYS = 20
# The event the producer refuses once: key k3's 11th event (payload "n"), so that its key holds
# the events after it.
REFUSED_EVENT_NUMBER = 10 * FEW_KEYS + 3
REFUSAL = {REFUSED_EVENT_VARIABLE: str(REFUSED_EVENT_NUMBER)}


def _relay_of_scenario_broken(run: Run, *, variant: str, env: dict[str, str]) -> None:
    """The relay through `scenario_broken`: the real one unless env sets SCENARIO_BROKEN=1."""
    run.add(
        "relay-1",
        [sys.executable, "manage.py", "scenario_broken", variant, "--slot", run.run_id],
        env=env,
    )
    for index in (1, 2):
        run.add_consumer(index)


def _check_refusal(run: Run) -> None:
    """The fault happened: the refused event has a FAILED delivery record, the producer's
    refusal."""
    refused = OutboxEvent.objects.filter(topic=run.topic, payload__n=REFUSED_EVENT_NUMBER)
    failures = OutboxDelivery.objects.filter(
        event_id__in=refused.values("id"), outcome=OutboxDelivery.Outcome.FAILED
    )
    run.extra["refused_event_failures"] = list(failures.values_list("error", flat=True))
    if not run.extra["refused_event_failures"]:
        run.extra_problems.append(f"event {REFUSED_EVENT_NUMBER} has no FAILED delivery record")


# 16: database sessions terminated ---------------------------------------------------------

SESSION_KILLS = 15
SESSION_WAIT_SECONDS = 10.0


# The database sessions of the relays and the consumers: by the application_name the runner
# gives each process it starts.
_RELAY_AND_CONSUMER_SESSIONS_SQL = """
SELECT pid, application_name FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (application_name LIKE %s OR application_name LIKE %s)
"""
_RELAY_AND_CONSUMER_NAMES = [f"{SESSION_NAME_PREFIX}relay-%", f"{SESSION_NAME_PREFIX}consumer-%"]


def _terminate_relay_and_consumer_sessions() -> list[str]:
    """pg_terminate_backend of every database session of the relays and the consumers;
    returns the names of the sessions it ended."""
    with connection.cursor() as cursor:
        # The sessions are chosen first (MATERIALIZED): in one WHERE, PostgreSQL may call
        # pg_terminate_backend before it tests the name, on sessions that are not theirs.
        cursor.execute(
            f"""
            WITH chosen AS MATERIALIZED ({_RELAY_AND_CONSUMER_SESSIONS_SQL})
            SELECT application_name FROM chosen WHERE pg_terminate_backend(pid)
            """,  # noqa: S608 (a constant)
            _RELAY_AND_CONSUMER_NAMES,
        )
        return sorted(name for (name,) in cursor.fetchall())


def _relay_and_consumer_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM ({_RELAY_AND_CONSUMER_SESSIONS_SQL}) AS sessions",  # noqa: S608
            _RELAY_AND_CONSUMER_NAMES,
        )
        return int(cursor.fetchone()[0])


def _session_kills(run: Run) -> None:
    rounds: list[list[str]] = []
    run.extra["sessions_terminated"] = rounds
    for number in range(SESSION_KILLS):
        run.sleep(3)
        # A relay or consumer connects a moment after it starts (at the beginning of the run,
        # or restarted after a session it lost): a session is waited for, up to
        # SESSION_WAIT_SECONDS, so that each round strikes one.
        deadline = time.monotonic() + SESSION_WAIT_SECONDS
        while not _relay_and_consumer_sessions() and time.monotonic() < deadline:
            run.sleep(0.2)
        killed = run.fault(
            f"terminate the relay's and consumers' database sessions ({number + 1})",
            _terminate_relay_and_consumer_sessions,
        )
        killed.detail = ", ".join(killed.result) or "no session"
        run.verify(killed, seen=bool(killed.result), effect="a session ended")
        rounds.append(killed.result)


def _check_session_kills(run: Run) -> None:
    """The fault happened: both the relay's and the consumers' sessions were ended during
    the run (each round that ended none is a fault not seen)."""
    rounds = run.extra.get("sessions_terminated", [])
    names = {name for ended in rounds for name in ended}
    for process in ("relay-", "consumer-"):
        if not any(name.startswith(f"{SESSION_NAME_PREFIX}{process}") for name in names):
            run.extra_problems.append(f"no session of a {process}* process was ended")


# 17: order per key through handler failures ------------------------------------------------

FIRST_ATTEMPT_FAILURE_PERCENT = 5


def _handler_failures_start(run: Run, *, ordering: str = "key") -> None:
    """A relay, three consumers, and Celery beat and a worker for the inbox's retry task; the
    scenario handler fails the first attempt of 5 % of the events."""
    env = {
        "INBOX_ORDERING": ordering,
        FAILURE_PERCENT_VARIABLE: str(FIRST_ATTEMPT_FAILURE_PERCENT),
    }
    run.add_relay(1)
    for index in (1, 2, 3):
        run.add_consumer(index, env=env)
    run.add_celery_worker(1, env=env)
    run.add_celery_beat(1, env=env)


def _check_handler_failures(run: Run) -> None:
    """The fault happened: inbox rows whose first attempt failed (done on a later one, or not
    done), about 5 % of the events."""
    from inbox.models import InboxMessage

    retried = InboxMessage.objects.filter(
        consumer_group=run.group, topic=run.topic, attempts__gte=2
    ).count()
    run.extra["handler_failures"] = retried
    expected = run.events * FIRST_ATTEMPT_FAILURE_PERCENT // 100
    if retried < expected // 2:
        run.extra_problems.append(
            f"{retried} rows whose first attempt failed; about {expected} expected"
        )


def _no_dedup_consumers(run: Run) -> None:
    run.add_relay(1)
    for index in (1, 2):
        run.add_consumer(
            index,
            env={"INBOX_DEDUPLICATE": "false"},
            first_starts=2,
            first_starts_env={"INBOX_FAULT_INJECT": "after_db_commit"},
        )


# pooled-connections ---------------------------------------------------------------------
# The relay's database sessions through PgBouncer in session mode, the consumers' through
# PgBouncer in transaction mode (docs/integration.md, Behind a connection pooler). A relay
# SIGKILLed there leaves its server session to the pooler, which resets it (DISCARD ALL: its
# advisory locks, its LISTEN and its span table go) and hands it to the next client, mostly
# the relay that replaces it: the same server process id, none of its state.
POOLED_RELAY_KILLS = 10


def _pooled_start(run: Run) -> None:
    block = ports.recorded_block()
    run.add_relay(1, env={"DATABASE_URL": faults.pooled_database_url(block.session_pool)})
    for index in (1, 2):
        run.add_consumer(
            index, env={"DATABASE_URL": faults.pooled_database_url(block.transaction_pool)}
        )
    run.extra["transaction_pool_transactions_at_start"] = faults.pool_transactions(
        block.transaction_pool
    )


def _database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _sessions_made_by(name: str, *, since: datetime, timeout: float = 30.0) -> set[int]:
    """The server process ids of the sessions through which the managed process `name` has
    run a statement since `since` (its sessions carry its name as application_name, which
    PgBouncer passes on), once there is one. A session the pooler keeps after its client died
    keeps the name too, but runs nothing more."""
    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                "AND query_start >= %s",
                [f"{SESSION_NAME_PREFIX}{name}", since],
            )
            sessions = {row[0] for row in cursor.fetchall()}
        if sessions or time.monotonic() >= deadline:
            return sessions
        time.sleep(0.2)


def _pooled_faults(run: Run) -> None:
    relay = run.processes["relay-1"]
    sessions: list[list[int]] = []
    run.extra["relay_server_sessions"] = sessions
    reused = 0
    started = _database_now() - timedelta(minutes=5)
    for number in range(POOLED_RELAY_KILLS):
        run.sleep(run.random.uniform(2, 4))
        before = _sessions_made_by("relay-1", since=started)
        killed = run.kill(
            f"SIGKILL relay ({number + 1})",
            relay,
            when=run.after_next_commit(),
            moment=JUST_COMMITTED,
            when_timeout=COMMIT_WAIT_SECONDS,
            aim_seen=False,
        )
        # The killed relay runs nothing more; its successor starts a second or so later, once
        # Django is loaded.
        started = _database_now()
        after = _sessions_made_by("relay-1", since=started)
        sessions.append(sorted(before))
        reused += bool(before & after)
        killed.detail += f"; server sessions {sorted(before)}, then {sorted(after)}"
        if not (before and after):
            run.verify(
                killed,
                seen=False,
                effect="the relay had server sessions through the pooler before and after",
            )
    run.extra["relay_server_sessions_reused"] = reused
    if not reused:
        run.extra_problems.append(
            "no restarted relay got a server session of the relay before it (DISCARD ALL'd): "
            "the pooler's reset was never met"
        )
    block = ports.recorded_block()
    passed = (
        faults.pool_transactions(block.transaction_pool)
        - run.extra["transaction_pool_transactions_at_start"]
    )
    run.extra["transaction_pool_transactions"] = passed
    if passed <= 0:
        run.extra_problems.append("no transaction went through the transaction-mode pooler")


# primary-failover -----------------------------------------------------------------------
# PostgreSQL's primary lost while events flow, its streaming standby promoted, the old primary
# back as the new one's standby, then a clean switch back to it. Every process, this run's
# writers and the checker included, reaches the database through a connection string naming
# both servers with target_session_attrs=read-write (faults.failover_database_url). Before
# the primary dies its standby falls behind: the WAL sender is stopped for a moment while the
# writers go on, so the primary holds commits its standby never receives.
# - Synchronous replication: those commits never return (a commit waits for the standby's
#   flush) and no other session sees them (PostgreSQL ends a committing transaction in its
#   process array only after the standby's answer): the writers retry them on the new
#   primary; nothing they saw committed is lost and the relay sends nothing the new primary
#   lacks.
# - Asynchronous replication: they return, and the relay may have sent them: the new primary
#   lacks events the writers saw committed, and Kafka holds records of some of them. Both are
#   counted apart from losses (the checker's `log_unreplicated`); every event the new primary
#   holds must still be delivered, in order, once.
# An orchestrator's time to notice the primary is gone and promote (Patroni's loop, a health
# check's interval): the clients find no primary meanwhile.
FAILOVER_DETECT_SECONDS = 2.0
# How long the standby falls behind before the primary dies (with asynchronous replication,
# after a writer's commit has returned).
REPLICATION_STOP_SECONDS = 2.0
# From the promotion to the first delivery the relay records on the new primary.
FAILOVER_DELIVERY_BOUND_SECONDS = 10.0
FAILOVER_DELIVERY_WAIT_SECONDS = 60.0
FAILOVER_FAULTS = 5
GROUP_STEADY_SECONDS = 60.0
# What a consumer logs when it reads partitions again from the offsets the database holds.
CONSUMER_READ_AGAIN = "reading those partitions again from the database's offsets"


def _use_database_url(url: str) -> dict[str, Any]:
    """Points this process's connections (every thread's, at its next connect) at `url`;
    returns the settings it replaced."""
    database = connection.settings_dict
    replaced = {name: database.get(name) for name in ("HOST", "PORT", "OPTIONS")}
    parsed = environ.Env.db_url_config(url)
    database.update(
        HOST=parsed["HOST"],
        PORT=parsed["PORT"],
        OPTIONS={**database.get("OPTIONS", {}), **parsed.get("OPTIONS", {})},
    )
    connection.close()
    return replaced


def _failover_start(run: Run, *, replication: str) -> None:
    run.extra["replication"] = replication
    run.extra["standby_pid"] = faults.postgres_standby(replication)
    url = faults.failover_database_url()
    run.extra["database_settings_replaced"] = _use_database_url(url)
    run.add_relay(1, env={"DATABASE_URL": url})
    for index in (1, 2):
        run.add_consumer(index, env={"DATABASE_URL": url})


def _first_delivery_after(moment: datetime, timeout: float) -> float | None:
    """Seconds from `moment` to the first delivery recorded after it, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            first = (
                OutboxDelivery.objects.filter(published_at__gt=moment)
                .order_by("published_at")
                .values_list("published_at", flat=True)
                .first()
            )
        except DatabaseError:
            connection.close()
            first = None
        if first is not None:
            return (first - moment).total_seconds()
        time.sleep(0.1)
    return None


def _wait_group_steady(run: Run, timeout: float) -> float | None:
    """Seconds until the group has stored a position in every partition (its consumers
    joined and applied a batch of each), once it has."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        stored = ConsumerOffset.objects.filter(consumer_group=run.group, topic=run.topic)
        if stored.count() == PARTITIONS:
            return time.monotonic() - started
        time.sleep(0.2)
    return None


def _failover(run: Run) -> None:
    replication = run.extra["replication"]
    block = ports.recorded_block()
    timelines = [faults.postgres_timeline(block.postgres)]
    run.extra["timelines"] = timelines
    # The failover strikes a group in its stride: a group whose first transactions on a
    # partition are lost with the primary is read from where its consumer stands
    # (docs/inbox.md).
    steady = _wait_group_steady(run, GROUP_STEADY_SECONDS)
    run.extra["group_steady_seconds"] = steady
    if steady is None:
        run.extra_problems.append(
            f"the group stored no position in some partition within {GROUP_STEADY_SECONDS:g} s"
        )
    run.sleep(run.random.uniform(2, 4))
    run.wait_for_moment(run.after_next_commit(), COMMIT_WAIT_SECONDS)
    behind = run.fault("Stop the WAL sender to the standby", faults.postgres_replication_stop)
    behind.detail = f"WAL sender pid {behind.result}"
    # Writers commit meanwhile: asynchronous, their commits return (the schedule waits for
    # one); synchronous, they wait for the standby's flush, till the primary dies.
    commit_returned = run.after_next_commit()
    if replication == "async":
        run.wait_for_moment(commit_returned, COMMIT_WAIT_SECONDS)
    run.sleep(REPLICATION_STOP_SECONDS)  # the relay sends what it sees meanwhile
    returned = commit_returned()
    lag = faults.replication_lag_bytes()
    waiting = faults.commits_waiting_for_standby()
    run.extra.update(standby_behind_bytes=lag, commits_waiting_for_standby=waiting)
    effect = f"the standby is {lag} bytes of WAL behind; "
    if replication == "sync":
        seen = lag > 0 and waiting > 0
        effect += f"{waiting} commits wait for its flush"
    else:
        seen = lag > 0 and returned
        effect += f"a writer's commit returned meanwhile: {'yes' if returned else 'no'}"
    run.verify(behind, seen=seen, effect=effect)
    killed = run.fault("SIGKILL the primary (postmaster and backends)", faults.postgres_kill)
    killed.detail = f"postmaster pid {killed.result}"
    run.verify(
        killed,
        seen=faults.postgres_refuses(block.postgres),
        effect=f"nothing listens on the primary's port {block.postgres} any more",
    )
    run.sleep(FAILOVER_DETECT_SECONDS)
    promoted = run.fault("Promote the standby", faults.postgres_promote)
    timelines.append(faults.postgres_timeline(block.standby))
    promoted.detail = f"postmaster pid {promoted.result}, timeline {timelines[-1]}"
    run.verify(
        promoted,
        seen=timelines[-1] > timelines[0],
        effect="the standby writes on a new timeline",
    )
    to_delivery = _first_delivery_after(promoted.ended_at, FAILOVER_DELIVERY_WAIT_SECONDS)
    run.extra["promotion_to_first_delivery_seconds"] = to_delivery
    if to_delivery is None or to_delivery > FAILOVER_DELIVERY_BOUND_SECONDS:
        run.extra_problems.append(
            f"the relay recorded no delivery on the new primary within "
            f"{FAILOVER_DELIVERY_BOUND_SECONDS:g} s of its promotion ({to_delivery} s)"
        )
    run.sleep(run.random.uniform(1, 2))
    rejoined = run.fault(
        "The old primary back as the new one's standby",
        partial(faults.postgres_rejoin, replication),
    )
    rejoined.detail = f"postmaster pid {rejoined.result}"
    run.verify(
        rejoined,
        seen=rejoined.result != killed.result,
        effect="a new postmaster on the old primary's port streams from the promoted server",
    )
    run.sleep(run.random.uniform(2, 4))
    run.wait_for_moment(run.after_next_commit(), COMMIT_WAIT_SECONDS)
    back = run.fault("Switch back to the first server", faults.postgres_switchback)
    timelines.append(faults.postgres_timeline(block.postgres))
    back.detail = f"postmaster pid {back.result}, timeline {timelines[-1]}"
    run.verify(
        back,
        seen=timelines[-1] > timelines[-2],
        effect="the first server writes on a newer timeline again",
    )


def _committed_numbers_missing(run: Run) -> list[int]:
    """The numbers of events a writer saw committed that the database does not hold."""
    held = set(OutboxEvent.objects.filter(topic=run.topic).values_list("payload__n", flat=True))
    return sorted(set(range(run.events)) - held)


def _check_failover(run: Run) -> None:
    replaced = run.extra.pop("database_settings_replaced")
    missing = _committed_numbers_missing(run)
    run.extra["committed_events_missing"] = len(missing)
    if missing and run.extra["replication"] == "sync":
        run.extra_problems.append(
            f"{len(missing)} events the writers saw committed are not in the database after "
            f"the failover (numbers {missing[:5]})"
        )
    # Consumers whose first batch on the new primary started past the offset it held (the
    # primary lost their last transactions): they read those partitions again.
    run.extra["consumer_partitions_read_again"] = sum(
        process.log_text().count(CONSUMER_READ_AGAIN)
        for name, process in run.processes.items()
        if name.startswith("consumer-")
    )
    connection.settings_dict.update(replaced)
    connection.close()


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("baseline", "Baseline, no faults", False, _standard, _no_faults),
        Scenario(
            "relay-kill",
            "Relay SIGKILLed every 2-5 s, 20 times (10 in smaller runs)",
            True,
            _standard,
            _relay_kills,
            production_seconds=75,
            min_production_seconds=40,
            planned_faults=RELAY_KILLS,
            small_planned_faults=RELAY_KILLS_SMALL,
        ),
        Scenario(
            "leader-kill",
            "Partition leader SIGKILLed and restarted, 5 rounds (3 in smaller runs)",
            True,
            _standard,
            _leader_kills,
            production_seconds=120,
            planned_faults=2 * LEADER_KILL_ROUNDS,
            small_planned_faults=2 * LEADER_KILL_SMALL_ROUNDS,
        ),
        Scenario(
            "rolling-restart",
            "Clean rolling restart of every broker",
            False,
            _standard,
            _rolling_restart,
            production_seconds=60,
            planned_faults=6,
        ),
        Scenario(
            "two-brokers-down",
            "Two brokers down for 60 s (40 s in smaller runs)",
            True,
            _standard,
            _two_brokers_down,
            production_seconds=80,
            after=_check_nothing_done_during_outage,
        ),
        Scenario(
            "broker-pause",
            "A broker paused with SIGSTOP for 40 s",
            True,
            _standard,
            _broker_pause,
            production_seconds=50,
        ),
        Scenario(
            "concurrent-relays",
            "Three relays and two beat schedulers at once",
            False,
            _concurrent_start,
            _concurrent_faults,
            production_seconds=20,
            after=_check_concurrent,
        ),
        Scenario(
            "consumer-kill",
            "Consumers SIGKILLed every 3 s, 15 times (8 in smaller runs)",
            True,
            lambda run: _standard(run, consumers=3),
            _consumer_kills,
            production_seconds=50,
            min_production_seconds=27,
            planned_faults=CONSUMER_KILLS,
            small_planned_faults=CONSUMER_KILLS_SMALL,
        ),
        Scenario(
            "rebalance-storm",
            "Consumers joining and leaving every 2 s",
            True,
            _standard,
            _rebalance_storm,
            production_seconds=45,
            planned_faults=20,
            after=_check_rebalance,
        ),
        Scenario(
            "rebalance-storm-kip848",
            "Consumers joining and leaving every 2 s, consumer group protocol (KIP-848)",
            True,
            _standard,
            _rebalance_storm,
            production_seconds=45,
            planned_faults=20,
            after=_check_rebalance,
            group_protocol="consumer",
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
            production_seconds=40,
            planned_faults=6,
        ),
        Scenario(
            "celery-redis",
            "Celery worker SIGKILLed, Redis restarted",
            True,
            _celery_start,
            _celery_faults,
            production_seconds=25,
            planned_faults=5,
        ),
        Scenario(
            "long-snapshot",
            "Event-log relay under a held REPEATABLE READ snapshot and a pg_dump",
            False,
            _standard,
            _long_snapshot,
            production_seconds=50,
            planned_faults=3,
            after=_check_long_snapshot,
        ),
        Scenario(
            "hot-keys",
            "Event-log relay, every event on 4 keys, SIGKILLed 5 times",
            False,
            _standard,
            _hot_key_relay_kills,
            production_seconds=40,
            planned_faults=5,
            keys=4,
        ),
        Scenario(
            "relay-takeover",
            "Two event-log relays, the shards' owner SIGKILLed 8 times",
            True,
            lambda run: _standard(run, relays=2),
            _relay_takeovers,
            production_seconds=45,
            planned_faults=8,
            after=_check_takeovers,
        ),
        Scenario(
            "db-session-kill",
            "The relay's and consumers' database sessions terminated every 3 s, 15 times",
            True,
            _standard,
            _session_kills,
            production_seconds=50,
            planned_faults=SESSION_KILLS,
            after=_check_session_kills,
        ),
        Scenario(
            "handler-failures",
            "Handlers failing 5 % of first attempts on 100 keys, consumers SIGKILLed",
            True,
            _handler_failures_start,
            _consumer_kills,
            production_seconds=50,
            planned_faults=15,
            keys=100,
            after=_check_handler_failures,
        ),
        Scenario(
            "nudge-path",
            "Relay only by on-commit nudges (beat every 60 s), the Celery worker SIGKILLed "
            "mid-task",
            False,
            _nudge_path_start,
            _nudge_path_faults,
            production_seconds=250,
            min_production_seconds=25,
            events_per_transaction=10,
            planned_faults=2 * NUDGE_WORKER_KILLS,
            after=_check_nudge_path,
        ),
        Scenario(
            "idle-transaction",
            "A transaction idle in transaction holding its snapshot while events flow and "
            "retention runs",
            False,
            _idle_transaction_start,
            _idle_transaction,
            production_seconds=300,
            min_production_seconds=45,
            planned_faults=IDLE_SAMPLES + 2,
            after=_check_idle_transaction,
        ),
        Scenario(
            "late-lock-writers",
            f"{LATE_LOCK_WRITERS} writers on {LATE_LOCK_KEYS} aggregates, each taking its "
            "transaction id before the aggregate's lock",
            True,
            _late_lock_start,
            _no_faults,
            production_seconds=200,
            min_production_seconds=10,
            keys=LATE_LOCK_KEYS,
            write=_late_lock_write,
            writers=LATE_LOCK_WRITERS,
            after=_check_late_lock,
        ),
        Scenario(
            "quiet-replay",
            f"{QUIET_REPLAYS + QUIET_BULK_REPLAYS} delivered events replayed with their own "
            "ids by an operator once the database is quiet",
            True,
            _quiet_replay_start,
            _quiet_replays,
            production_seconds=WRITING_SECONDS,
            min_production_seconds=MIN_WRITING_SECONDS,
            write=_spread_write,
            after=_check_quiet_replay,
            # Everything is delivered before the replays; a replay never sent stays PENDING.
            stall_seconds=30,
        ),
        Scenario(
            "missing-topic",
            "Events on a topic that does not exist (none created on demand) beside events "
            "that flow; the topic created, the held events retried",
            True,
            _missing_topic_start,
            _missing_topic_faults,
            production_seconds=WRITING_SECONDS,
            min_production_seconds=MIN_WRITING_SECONDS,
            write=partial(_spread_write, then=_missing_topic_events),
            after=_check_missing_topic,
            stall_seconds=30,
        ),
        Scenario(
            "acl-denied",
            "The relay's user, on Kafka's TLS and SCRAM listener, loses its permission to "
            "write one topic while events flow to it and to others; the permission given back",
            True,
            _acl_denied_start,
            _acl_denied_faults,
            production_seconds=WRITING_SECONDS,
            min_production_seconds=ACL_DENIED_MIN_WRITING_SECONDS,
            write=_spread_write,
            after=_check_acl_denied,
            stall_seconds=30,
        ),
        Scenario(
            "pooled-connections",
            "Relay through PgBouncer in session mode, SIGKILLed 10 times (its server session "
            "reset by DISCARD ALL and handed on); consumers through PgBouncer in transaction "
            "mode",
            True,
            _pooled_start,
            _pooled_faults,
            production_seconds=30,
            planned_faults=POOLED_RELAY_KILLS,
        ),
        Scenario(
            "primary-failover",
            "PostgreSQL's primary SIGKILLed while its synchronous standby is behind, the "
            "standby promoted, the old primary back as a standby, then a switch back",
            True,
            partial(_failover_start, replication="sync"),
            _failover,
            production_seconds=30,
            planned_faults=FAILOVER_FAULTS,
            after=_check_failover,
        ),
        Scenario(
            "primary-failover-async",
            "The same with asynchronous replication: the commits the standby missed are lost "
            "with the primary, and counted apart",
            True,
            partial(_failover_start, replication="async"),
            _failover,
            production_seconds=30,
            planned_faults=FAILOVER_FAULTS,
            after=_check_failover,
            unreplicated_allowed=True,
        ),
        Scenario(
            "refused-event",
            "Event-log relay, an event refused once by the producer holds its key",
            False,
            partial(_relay_of_scenario_broken, variant="log-relay-no-retry", env=REFUSAL),
            _no_faults,
            production_seconds=5,
            keys=FEW_KEYS,
            after=_check_refusal,
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
            "broken-log-relay-cursor-first",
            "BROKEN event-log relay: cursor moved before the delivery report",
            False,
            _broken_log_relay,
            _no_faults,
            production_seconds=5,
            expect_fail=True,
            stall_seconds=20,
        ),
        Scenario(
            "broken-log-relay-reversed",
            "BROKEN event-log relay: each batch sent in reverse commit order",
            False,
            partial(
                _relay_of_scenario_broken,
                variant="log-relay-reversed",
                env={"SCENARIO_BROKEN": "1"},
            ),
            _no_faults,
            production_seconds=5,
            keys=FEW_KEYS,
            expect_fail=True,
        ),
        Scenario(
            "broken-log-relay-txid-order",
            "BROKEN event-log relay: each batch sent in transaction-id order, under "
            "late-lock writers",
            True,
            partial(_late_lock_start, broken_relay=True),
            _no_faults,
            production_seconds=200,
            min_production_seconds=10,
            keys=LATE_LOCK_KEYS,
            write=_late_lock_write,
            writers=LATE_LOCK_WRITERS,
            after=_check_late_lock,
            expect_fail=True,
        ),
        Scenario(
            "broken-log-relay-no-retry",
            "BROKEN event-log relay: a key held after a refused event is never retried",
            False,
            partial(
                _relay_of_scenario_broken,
                variant="log-relay-no-retry",
                env={"SCENARIO_BROKEN": "1", **REFUSAL},
            ),
            _no_faults,
            production_seconds=5,
            keys=FEW_KEYS,
            after=_check_refusal,
            expect_fail=True,
            # 20 times the first retry's backoff (OUTBOX["RETRY_BASE_SECONDS"], 1 s).
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
        Scenario(
            "broken-ordering-none",
            "BROKEN order per key: handlers failing 5 % of first attempts, ordering none",
            False,
            partial(_handler_failures_start, ordering="none"),
            _no_faults,
            production_seconds=20,
            keys=100,
            after=_check_handler_failures,
            expect_fail=True,
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
