"""The scenario runner: N events on K keys with per-key sequence numbers, written through
outbox.publish in transactions while relays, consumers and Celery run as `manage.py`
subprocesses and a fault schedule strikes; then it waits for delivery to complete and runs
the delivery checker.

Runs in a process whose settings point at the isolated services (scenarios/faults.py);
the `scenario_run` command makes sure of it."""

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import NewTopic, OffsetSpec
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.db.models import CharField, Count, Min
from django.db.models.functions import Cast

import outbox
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from outbox.selectors import outbox_events_with_delivery
from outbox.services.event_log.cursors import event_log_start_afresh
from scenarios import faults, ports
from scenarios.checker import DeliveryReport, delivery_check
from scenarios.conf import AGGREGATE_TYPE, EVENT_TYPE, GROUP_VARIABLE, RUN_VARIABLE, TOPIC_VARIABLE
from scenarios.models import ScenarioEffect

logger = logging.getLogger(__name__)

PARTITIONS = 6
# The application_name of the database sessions of a process the runner starts, before its
# name (relay-1, consumer-2, ...).
SESSION_NAME_PREFIX = "scenario-"
# Events are written on this many keys (k0, k1, ...) unless a run says otherwise.
DEFAULT_KEYS = 1000
EVENTS_PER_TRANSACTION = 100
# Each writer writes at least this many transactions (smaller ones in small runs).
MIN_TRANSACTIONS = 20
# Threads writing events, each for its own keys.
WRITERS = 4
# How long delivery may take to complete after the last fault before the run gives up. A
# caller that bounds a whole run (tests/scenarios/limits.py) allows this, plus the writing and
# the fault schedule, plus stopping the processes and the check.
COMPLETION_TIMEOUT_SECONDS = 600.0
# After completion, how long to keep the consumers running so a late duplicate shows up.
SETTLE_SECONDS = 3.0
STOP_TIMEOUT_SECONDS = 30.0
RESTART_DELAY_SECONDS = 0.5


def _now() -> float:
    return time.monotonic()


def process_group(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group `pgid`, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # "pid (command) state ppid pgrp ...": the command may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return sorted(members)


# /proc/PID/stat's flags: the process is exiting (a signal that kills it has been taken).
_PF_EXITING = 0x4


def spared(pids: list[int]) -> list[int]:
    """Of `pids`, the processes alive that no SIGKILL has reached: not exiting, not a zombie,
    and no SIGKILL pending. Read right after a process group was SIGKILLed, it names the
    members the signal missed, before they could exit on their own (a child that its parent's
    death does not kill lives on: a Celery pool child would finish its task)."""
    missed = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:  # gone
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X") or int(fields[6]) & _PF_EXITING:
            continue
        pending = 0
        for line in status.splitlines():
            if line.startswith(("SigPnd:", "ShdPnd:")):
                pending |= int(line.split()[1], 16)
        if not pending & (1 << (signal.SIGKILL - 1)):
            missed.append(pid)
    return missed


def _wait_for_moment(
    moment: Callable[[], bool], timeout: float, *, give_up: Callable[[], bool] = lambda: False
) -> bool:
    """Waits (at most `timeout`, or until `give_up()`) for `moment()` to be true, asking every
    10 ms; whether it came. The caller acts right after: the gap is one call."""
    deadline = _now() + timeout
    while not (came := moment()) and _now() < deadline and not give_up():
        time.sleep(0.01)
    return came


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # nothing left in the group
        os.killpg(pgid, signal.SIGKILL)


@dataclass
class Killed:
    """One SIGKILL of a process's whole group: who was in it, who the signal missed (alive,
    not dying, when the process itself had died), and who was still alive 10 s later."""

    pid: int
    group: list[int]
    spared: list[int]
    survivors: list[int]
    # The process's exit status as its parent saw it: -9 when the SIGKILL ended it.
    returncode: int | None = None
    # For a kill aimed at a moment (Managed.kill's `when`): whether that moment came, read
    # right before the signal; None for a kill at any moment.
    aimed: bool | None = None
    # When the signal went.
    signalled_at: datetime | None = None


class Managed:
    """A `manage.py` (or celery) subprocess the runner keeps alive: when it dies (a fault,
    a crash) it is started again, unless the fault schedule removed it."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_dir: Path,
        *,
        first_starts_env: dict[str, str] | None = None,
        first_starts: int = 0,
        keep_alive: bool = True,
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.first_starts_env = first_starts_env or {}
        self.first_starts = first_starts
        self.keep_alive = keep_alive
        self.starts = 0
        self.kills = 0
        self.killed: list[Killed] = []
        # The pid of each start.
        self.pids: list[int] = []
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.restart_after = 0.0

    def start(self) -> None:
        env = dict(self.env)
        if self.starts < self.first_starts:
            env.update(self.first_starts_env)
        self.starts += 1
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._log.write(f"--- start {self.starts} at {datetime.now(UTC).isoformat()}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            self.argv,
            env=env,
            cwd=settings.BASE_DIR,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own session and process group (pgid = its pid): a SIGKILL reaches the
            # processes it forked too, such as a Celery worker's pool.
            start_new_session=True,
        )
        self.pids.append(self.process.pid)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def group(self) -> list[int]:
        """The live processes of its current process group: itself and what it forked."""
        return process_group(self.process.pid) if self.process is not None else []

    def wait_group(self, size: int, timeout: float) -> bool:
        """Waits until its group has `size` live processes (a Celery worker and its pool)."""
        deadline = _now() + timeout
        while _now() < deadline:
            if self.alive and len(self.group()) >= size:
                return True
            time.sleep(0.2)
        return False

    def kill(
        self, *, when: Callable[[], bool] | None = None, when_timeout: float = 30.0
    ) -> Killed | None:
        """SIGKILL to the whole process group, so that what it forked (a Celery worker's pool)
        dies with it instead of finishing its work, whether or not it would die of its
        parent's death on its own; then waits until none of the group is left. The supervisor
        starts it again. None when it was not running.

        With `when`, the signal waits (at most `when_timeout`) until `when()` is true, asked
        right before it (a worker in the middle of a task): the gap between the answer and
        the signal is one call."""
        process = self.process
        if process is None or process.poll() is not None:
            return None
        # No restart by the supervisor while the group dies.
        self.restart_after = float("inf")
        try:
            group = process_group(process.pid)
            aimed = None
            if when is not None:
                aimed = _wait_for_moment(
                    when, when_timeout, give_up=lambda: process.poll() is not None
                )
            self.kills += 1
            signalled_at = datetime.now(UTC)
            _kill_group(process.pid)
            returncode = process.wait(10)
            missed = spared([pid for pid in group if pid != process.pid])
            deadline = _now() + 10
            survivors = process_group(process.pid)
            while survivors and _now() < deadline:
                time.sleep(0.1)
                survivors = process_group(process.pid)
            killed = Killed(
                pid=process.pid,
                group=group,
                spared=missed,
                survivors=survivors,
                returncode=returncode,
                aimed=aimed,
                signalled_at=signalled_at,
            )
            self.killed.append(killed)
            return killed
        finally:
            self.restart_after = _now() + RESTART_DELAY_SECONDS

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int | None:
        """SIGTERM, a clean stop; SIGKILL to its group if it is still running after
        `timeout`, and to whatever it left in its group in any case. Returns the exit code
        (negative: the signal that ended it)."""
        self.keep_alive = False
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(process.pid)
                process.wait(10)
        if process_group(process.pid):
            _kill_group(process.pid)
        if self._log is not None:
            self._log.close()
            self._log = None
        return process.returncode

    def log_text(self) -> str:
        """Everything its starts wrote (stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def supervise(self) -> None:
        if self.keep_alive and not self.alive and _now() >= self.restart_after:
            self.start()
            # A process that keeps dying (its database is down) is retried once a second.
            self.restart_after = _now() + 1.0


@dataclass
class Fault:
    what: str
    started: float
    ended: float
    started_at: datetime
    ended_at: datetime
    # What the action returned (a pid, a report), and what the schedule says it showed.
    result: Any = None
    detail: str = ""
    # Whether the schedule saw the fault's effect (leadership moved, Redis refused a
    # connection, the process died of the SIGKILL); None for an entry that is no fault (a
    # restart, the end of an outage).
    verified: bool | None = None
    effect: str = ""
    # An entry that samples what a fault left (a held snapshot, its close), not a fault: its
    # effect is verified like a fault's, but it is not counted as one.
    check: bool = False

    def line(self) -> str:
        when = f"{self.started_at:%H:%M:%S.%f}"[:-3]
        detail = f": {self.detail}" if self.detail else ""
        seen = ""
        if self.verified is not None:
            seen = f" [{'seen' if self.verified else 'NOT SEEN'}: {self.effect}]"
        kind = "check: " if self.check else ""
        return f"{when} +{self.ended - self.started:.1f}s {kind}{self.what}{detail}{seen}"


@dataclass
class ScenarioResult:
    name: str
    events: int
    keys: int
    report: DeliveryReport
    # Faults whose effect the schedule saw (Fault.verified).
    faults: int
    seconds: float
    complete: bool
    # Delivery complete, counted from the end of the last fault (or of production, if later);
    # None when incomplete, or when every event had been applied before the last fault began.
    seconds_after_last_fault: float | None
    expect_fail: bool = False
    # Every event was applied before the last fault began: that fault struck an idle system.
    delivered_before_last_fault: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    extra_problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.complete and self.report.ok and not self.extra_problems

    @property
    def as_expected(self) -> bool:
        return self.passed != self.expect_fail

    def problems(self) -> list[str]:
        found = list(self.report.problems()) + self.extra_problems
        if not self.complete:
            found.insert(0, "delivery did not complete")
        return found

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "events": self.events,
            "keys": self.keys,
            "lost": self.report.lost,
            "duplicate_effects": self.report.duplicate_effects,
            "log_duplicates": self.report.log_duplicates,
            "inversions": self.report.inversions,
            "stuck": self.report.stuck,
            "faults": self.faults,
            "seconds": round(self.seconds, 1),
            "complete": self.complete,
            "seconds_after_last_fault": (
                None
                if self.seconds_after_last_fault is None
                else round(self.seconds_after_last_fault, 1)
            ),
            "delivered_before_last_fault": self.delivered_before_last_fault,
            "passed": self.passed,
            "expect_fail": self.expect_fail,
            "as_expected": self.as_expected,
            "problems": self.problems(),
            "extra": self.extra,
            "report": self.report.as_dict(),
        }


class Run:
    """One run of one scenario: its topic, group, processes, producer and fault log."""

    def __init__(self, scenario: "Scenario", *, events: int, keys: int, seed: int | None) -> None:
        self.scenario = scenario
        self.events = events
        self.planned_faults = scenario.planned_faults_at(events)
        self.keys = keys
        self.random = random.Random(seed)
        self.run_id = f"{datetime.now(UTC):%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}"
        self.topic = f"scenario.{scenario.name}.{self.run_id}"
        self.group = f"scenario-{scenario.name}-{self.run_id}"
        self.log_dir = ports.local_dir() / "runs" / f"{scenario.name}-{self.run_id}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, Managed] = {}
        self.faults: list[Fault] = []
        self.extra: dict[str, Any] = {}
        self.extra_problems: list[str] = []
        self.production_done = threading.Event()
        self.production_ended = 0.0
        # Set when the fault schedule has returned; the writers wait on `_schedule` for it and
        # for each fault (`_may_write`).
        self.faults_done = threading.Event()
        self.faults_ended = 0.0
        self._schedule = threading.Condition()
        # How long each writer waited for the fault schedule in all.
        self.writers_waited: list[float] = []
        # Transactions the writers committed, and how many writers cannot commit before the
        # next fault (done, or waiting for the end of the schedule): what `after_next_commit`
        # watches. It announces the next fault: the writers may then write the step that
        # follows it (`_may_write`), so that the fault strikes amid their writing.
        self._commits = 0
        self._writers_finished = 0
        self._faults_announced = 0
        self.production_error: BaseException | None = None
        self._stop_supervisor = threading.Event()
        self._lock = threading.Lock()

    # Environment and processes ----------------------------------------------------------

    def environment(self, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            **faults.isolated_environment(),
            "DJANGO_SETTINGS_MODULE": "project.settings.local",
            "PYTHONUNBUFFERED": "1",
            TOPIC_VARIABLE: self.topic,
            GROUP_VARIABLE: self.group,
            RUN_VARIABLE: self.run_id,
            "OUTBOX_NUDGE_ON_COMMIT": "false",
            "INBOX_POLL_TIMEOUT_SECONDS": "0.2",
            # Beat must not start the Spark job in the middle of a scenario.
            "ANALYTICS_INTERVAL_SECONDS": "86400",
            "LOG_LEVEL": "WARNING",
        }
        for name in ("OUTBOX_FAULT_INJECTION", "INBOX_FAULT_INJECT", "TEST_DATABASE_NAME"):
            env.pop(name, None)
        env.update(extra)
        return env

    def add(self, name: str, argv: list[str], **options: Any) -> Managed:
        # libpq's application_name: the process's database sessions carry its name
        # (pg_stat_activity), so that a fault can aim at them.
        env_extra = {"PGAPPNAME": f"{SESSION_NAME_PREFIX}{name}", **options.pop("env", {})}
        managed = Managed(name, argv, self.environment(**env_extra), self.log_dir, **options)
        with self._lock:
            self.processes[name] = managed
        managed.start()
        return managed

    def add_relay(self, index: int, **options: Any) -> Managed:
        return self.add(
            f"relay-{index}",
            [
                sys.executable,
                "manage.py",
                "outbox_relay",
                "--poll-seconds",
                "0.2",
                "--slot",
                f"{self.run_id}-{index}",
            ],
            **options,
        )

    def add_consumer(self, index: int, *, static: bool = True, **options: Any) -> Managed:
        protocol = self.scenario.group_protocol
        # Under the consumer protocol (KIP-848) the broker decides sessions and heartbeats.
        properties = (
            []
            if protocol == "consumer"
            else ["session.timeout.ms=10000", "heartbeat.interval.ms=1000"]
        )
        if static:
            # Static membership: a restarted consumer takes its slot back at once instead of
            # waiting out the session of the one that was killed.
            properties.append(f"group.instance.id={self.group}-{index}")
        env = {
            "INBOX_CONSUMER_CONFIG": ",".join(properties),
            "INBOX_GROUP_PROTOCOL": protocol,
            **options.pop("env", {}),
        }
        argv = options.pop("argv", None) or [
            sys.executable,
            "manage.py",
            "inbox_consume",
            "--group",
            self.group,
        ]
        return self.add(f"consumer-{index}", argv, env=env, **options)

    def add_celery_worker(self, index: int = 1, *, concurrency: int = 2, **options: Any) -> Managed:
        return self.add(
            f"worker-{index}",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                # INFO: each task it ran, and what it returned (a relay task: events published).
                "--loglevel",
                "INFO",
                "--concurrency",
                str(concurrency),
                "--hostname",
                f"scenario-{index}-{self.run_id}@%h",
                "--without-gossip",
                "--without-mingle",
            ],
            **options,
        )

    def add_celery_beat(self, index: int = 1, **options: Any) -> Managed:
        return self.add(
            f"beat-{index}",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "project",
                "beat",
                # INFO: each task it sent.
                "--loglevel",
                "INFO",
                "--schedule",
                str(self.log_dir / f"beat-{index}.db"),
            ],
            **options,
        )

    def _supervise(self) -> None:
        while not self._stop_supervisor.wait(0.2):
            with self._lock:
                managed = list(self.processes.values())
            for process in managed:
                try:
                    process.supervise()
                except OSError as error:
                    logger.warning("cannot restart %s: %s", process.name, error)

    # Faults --------------------------------------------------------------------------------

    def fault(
        self, what: str, action: Callable[[], object] | None = None, *, check: bool = False
    ) -> Fault:
        """Runs `action` and logs it as one fault, from its start to its end; the fault keeps
        what the action returned (`result`), and the schedule may add what it showed
        (`detail`, in the fault log). With `check`, the entry samples what a fault left
        (Fault.check)."""
        started, started_at = _now(), datetime.now(UTC)
        result = action() if action is not None else None
        fault = Fault(
            what, started, _now(), started_at, datetime.now(UTC), result=result, check=check
        )
        with self._schedule:
            self.faults.append(fault)
            self._schedule.notify_all()
        return fault

    def verify(self, fault: Fault, *, seen: bool, effect: str) -> None:
        """Records whether the fault's effect was seen; a fault without it fails the run (the
        scenario would prove nothing about it)."""
        fault.verified, fault.effect = seen, effect
        if not seen:
            self.extra_problems.append(f"{fault.what}: its effect was not seen ({effect})")

    def kill(
        self,
        what: str,
        process: Managed,
        *,
        when: Callable[[], bool] | None = None,
        moment: str = "",
        when_timeout: float = 30.0,
        aim_seen: bool = True,
    ) -> Fault:
        """SIGKILLs a managed process as a fault, seen when the process was running and the
        signal ended it; with `when` (Managed.kill), also only if `moment` had come, as
        `when()` said right before the signal, unless `aim_seen` is false (the log still says
        whether it came)."""
        killed = self.fault(what, partial(process.kill, when=when, when_timeout=when_timeout))
        result: Killed | None = killed.result
        if result is not None:
            killed.detail = f"pid {result.pid}"
        ended = result is not None and result.returncode == -signal.SIGKILL
        effect = (
            f"{process.name} ended by the SIGKILL, exit status -9 (it exited with "
            f"{result.returncode if result else 'nothing: it was not running'})"
        )
        if when is not None:
            aimed = result is not None and bool(result.aimed)
            effect += f", {moment} at the signal: {'yes' if aimed else 'no'}"
            ended = ended and (aimed or not aim_seen)
        self.verify(killed, seen=ended, effect=effect)
        return killed

    def group_members(self) -> list[str] | None:
        """The consumer group's members as the coordinator has them: the group.instance.id of
        a static member, `dynamic` for the others; None when the coordinator cannot say. The
        group's protocol as the coordinator runs it goes to extra["group_types"]."""
        # The client must outlive the request: a future of a client already collected never
        # completes.
        client = faults.admin()
        try:
            description = client.describe_consumer_groups([self.group])[self.group].result(15)
        except Exception as error:  # a coordinator moving or loading: no answer this time
            logger.debug("cannot describe group %s: %s", self.group, error)
            return None
        types = self.extra.setdefault("group_types", [])
        kind = description.type.name.lower()
        # A group without members yet (its consumers still starting) is described as classic
        # whatever protocol its members will use: only a group with members tells.
        if description.members and kind not in types:
            types.append(kind)
        return sorted(member.group_instance_id or "dynamic" for member in description.members)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def after_next_commit(self) -> Callable[[], bool]:
        """A moment for the next fault, which must strike events on their way (a `when` of
        `kill`): true once a writer has committed a transaction after this call, so that its
        events are not yet applied; true at once when no writer can commit before the end of
        the schedule (all are done or wait for their last transaction). In a small run,
        writers commit a transaction every second or so and delivery takes tens of
        milliseconds: a fault at a random moment often meets nothing in flight. The call
        announces the fault: writers waiting for it may write their next step now."""
        with self._schedule:
            seen = self._commits
            self._faults_announced = len(self.faults) + 1
            self._schedule.notify_all()

        def committed() -> bool:
            return self._commits != seen or self._writers_finished >= self.scenario.writers

        return committed

    def wait_for_moment(self, moment: Callable[[], bool], timeout: float) -> bool:
        return _wait_for_moment(moment, timeout)

    # Producing events ----------------------------------------------------------------------

    def publish_batch(self, numbers: list[int]) -> None:
        """Publishes one transaction of events. A transaction whose commit may or may not
        have happened (the database crashed under it) is retried for the events that are
        missing, found by their number, so no event is written twice."""
        existing: set[int] = set()
        retrying = False
        while True:
            try:
                if retrying:
                    # A scan of the whole event table (payload->'n' has no index), about
                    # a thousand in a full-size run if made on every try: on the first no
                    # event of these numbers can exist.
                    existing = set(
                        OutboxEvent.objects.filter(
                            topic=self.topic, payload__n__in=numbers
                        ).values_list("payload__n", flat=True)
                    )
                with transaction.atomic():
                    for number in numbers:
                        if number in existing:
                            continue
                        key = f"k{number % self.keys}"
                        outbox.publish(
                            aggregate_type=AGGREGATE_TYPE,
                            aggregate_id=key,
                            event_type=EVENT_TYPE,
                            payload={"seq": number // self.keys, "n": number, "key": key},
                            topic=self.topic,
                        )
                return
            except DatabaseError as error:
                logger.info("producer: %s; retrying", error)
                retrying = True
                connection.close()
                time.sleep(0.5)

    def _may_write(self, written: float, *, last: bool) -> bool:
        """Whether a writer that has written this fraction of its events may go on: its last
        transaction only once the fault schedule is over, so that no fault strikes after the
        writing; the others no more than one step ahead of a schedule that plans its faults
        (after k of K, up to (k + 1) / (K + 1) of the events), so that a schedule slower than
        the writing's pace (a broker slow to start) slows the writing with it. A fault
        announced by `after_next_commit` counts as done here: it waits for the writing."""
        if self.faults_done.is_set():
            return True
        if last:
            return False
        planned = self.planned_faults
        steps = max(len(self.faults), self._faults_announced)
        return not planned or written <= (steps + 1) / (planned + 1)

    def writer_share(self, writer: int) -> tuple[list[int], int]:
        """The numbers of writer `writer`'s events, the keys k with k % writers == writer, in
        order (one writer per key keeps each key's events in the order of their sequence
        numbers), and the size of its transactions: small runs write smaller transactions, so
        that events keep flowing between faults rather than in a few bursts."""
        numbers = [
            n for n in range(self.events) if (n % self.keys) % self.scenario.writers == writer
        ]
        most = self.scenario.events_per_transaction
        return numbers, max(1, min(most, -(-len(numbers) // MIN_TRANSACTIONS)))

    def _write(self, writer: int, seconds: float, poison: int) -> None:
        """One writer: the events of the keys k with k % writers == writer, in order. One
        writer per key keeps each key's events in the order of their sequence numbers."""
        try:
            numbers, size = self.writer_share(writer)
            started = _now()
            poison_producer = _poison_producer() if poison else None
            poisoned = 0
            waited = 0.0
            for first in range(0, len(numbers), size):
                batch = numbers[first : first + size]
                waiting = _now()
                last = first + size >= len(numbers)
                with self._schedule:
                    self._writers_finished += last
                    self._schedule.wait_for(
                        partial(self._may_write, first / len(numbers), last=last)
                    )
                    self._writers_finished -= last
                waited += _now() - waiting
                self.publish_batch(batch)
                self.committed()
                done = first + len(batch)
                while poison_producer and poisoned < poison * done // len(numbers):
                    _produce_poison(poison_producer, self.topic, poisoned, self.keys)
                    poisoned += 1
                if seconds and done < len(numbers):
                    # Spread the events over `seconds` (each scenario's is about as long as
                    # its fault schedule), so that faults strike while they flow.
                    ahead = started + seconds * done / len(numbers) - _now()
                    if ahead > 0:
                        time.sleep(ahead)
            if poison_producer is not None:
                while poisoned < poison:
                    _produce_poison(poison_producer, self.topic, poisoned, self.keys)
                    poisoned += 1
                poison_producer.flush(60)
                self.extra["poison_records"] = poisoned
            self.writers_waited.append(waited)
        except BaseException as error:
            self.production_error = error
            raise
        finally:
            with self._schedule:
                self._writers_finished += 1
            connection.close()

    def committed(self) -> None:
        """Counts a transaction a writer committed (what `after_next_commit` watches)."""
        with self._schedule:
            self._commits += 1

    def _write_own(self, writer: int, seconds: float, poison: int) -> None:
        """One writer of a scenario that writes its events itself (Scenario.write), with the
        bookkeeping of the runner's own writers."""
        write = self.scenario.write
        assert write is not None
        try:
            write(self, writer, seconds)
        except BaseException as error:
            self.production_error = error
            raise
        finally:
            with self._schedule:
                self._writers_finished += 1
            connection.close()

    def _produce(self, seconds: float, poison: int) -> None:
        target = self._write if self.scenario.write is None else self._write_own
        writers = [
            threading.Thread(
                target=target,
                args=(writer, seconds, poison if writer == 0 else 0),
                name=f"writer-{writer}",
                daemon=True,
            )
            for writer in range(self.scenario.writers)
        ]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        self.production_ended = _now()
        self.production_done.set()

    # Completion ----------------------------------------------------------------------------

    def _expected_events(self) -> int:
        """The events delivery must reach: the run's, or those the database holds when it may
        have failed over without some commits (Scenario.unreplicated_allowed)."""
        if not self.scenario.unreplicated_allowed:
            return self.events
        return OutboxEvent.objects.filter(topic=self.topic).count()

    def _progress(self) -> tuple[int, int] | None:
        try:
            events = OutboxEvent.objects.filter(topic=self.topic)
            pending = outbox_events_with_delivery(events).exclude(delivery_status="DONE").count()
            effects = ScenarioEffect.objects.filter(consumer_group=self.group)
            if self.scenario.unreplicated_allowed:
                # Effects of records whose events the database lost are no progress.
                effects = effects.filter(
                    event_id__in=events.annotate(text_id=Cast("id", CharField())).values("text_id")
                )
            applied = effects.values("event_id").distinct().count()
            return pending, applied
        except DatabaseError:
            connection.close()
            return None

    def wait_complete(self, timeout: float, *, stall_seconds: float) -> bool:
        """Waits until every event is DONE in the outbox and applied in the group. Gives up
        after `timeout`, or when nothing has moved for `stall_seconds` (a killed relay leaves
        no lease to wait out: its shards go to another relay, or to its restart, when its
        database session ends)."""
        deadline = _now() + timeout
        last, moved = None, _now()
        while _now() < deadline and _now() - moved < stall_seconds:
            progress = self._progress()
            if progress is not None and progress == (0, self._expected_events()):
                return True
            if progress != last:
                last, moved = progress, _now()
            time.sleep(0.5)
        return False

    def stall_snapshot(self) -> list[str]:
        """What held delivery back, read while every process still runs: the group's committed
        offset in each partition against the last stable offset (held back by an open Kafka
        transaction) and the high watermark, the group's members, the processes that were
        down, and the database sessions that were not idle."""
        lines = [f"progress at the stall (outbox not DONE, events applied): {self._progress()}"]
        try:
            lines += _group_positions(self.topic, self.group)
        except Exception as error:  # the snapshot explains a failure; it must not add one
            lines.append(f"Kafka positions unavailable: {error}")
        down = [name for name, process in self.processes.items() if not process.alive]
        lines.append(f"processes down: {', '.join(down) or 'none'}")
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    """
                    SELECT pid, state, coalesce(wait_event_type || ':' || wait_event, '-'),
                           round(extract(epoch FROM now() - xact_start)), left(query, 100)
                    FROM pg_stat_activity
                    WHERE datname = current_database() AND pid <> pg_backend_pid()
                      AND state <> 'idle'
                    """
                )
                sessions = cursor.fetchall()
            lines += [
                f"database session {pid} {state}, waiting {wait}, transaction {age} s: {query}"
                for pid, state, wait, age, query in sessions
            ] or ["database: no session busy"]
        except DatabaseError as error:
            connection.close()
            lines.append(f"database sessions unavailable: {error}")
        return lines

    def _in_flight_at_last_fault(self) -> int | None:
        """How many events were not yet applied in the group when the last fault began
        (written later, or written and still on their way); None without faults. 0 means
        the last fault struck after delivery was complete."""
        if not self.faults:
            return None
        last = max(self.faults, key=lambda fault: fault.started)
        applied = (
            ScenarioEffect.objects.filter(consumer_group=self.group, applied_at__lt=last.started_at)
            .values("event_id")
            .distinct()
            .count()
        )
        return self.events - applied

    def _in_flight_at_faults(self) -> list[int]:
        """For each fault whose effect was seen, how many events it struck on their way:
        written before it ended and applied after it began. Events written only after a fault
        do not count (the writers' pacing guarantees those), so a fault between two quiet
        moments counts 0."""
        struck = [fault for fault in self.faults if fault.verified and not fault.check]
        if not struck:
            return []
        created = dict(OutboxEvent.objects.filter(topic=self.topic).values_list("id", "created_at"))
        first_applied = (
            ScenarioEffect.objects.filter(consumer_group=self.group)
            .values_list("event_id")
            .annotate(first=Min("applied_at"))
        )
        lives = [
            (created[uuid.UUID(event_id)], applied)
            for event_id, applied in first_applied
            if uuid.UUID(event_id) in created  # a poison record is no outbox event
        ]
        return [
            sum(1 for written, applied in lives if written < f.ended_at and applied > f.started_at)
            for f in struck
        ]

    def _effects_by_process(self) -> dict[str, int]:
        """How many effects each process applied (the effect table records the pid)."""
        names = {pid: p.name for p in self.processes.values() for pid in p.pids}
        counts: dict[str, int] = {}
        rows = (
            ScenarioEffect.objects.filter(consumer_group=self.group)
            .values_list("pid")
            .annotate(count=Count("id"))
        )
        for pid, count in rows:
            name = names.get(pid, f"pid {pid}")
            counts[name] = counts.get(name, 0) + count
        return counts

    def inbox_not_done(self) -> int:
        return InboxMessage.objects.filter(consumer_group=self.group).exclude(status="DONE").count()

    # The run ---------------------------------------------------------------------------------

    def execute(self) -> ScenarioResult:
        scenario = self.scenario
        create_topic(self.topic)
        started = _now()
        supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        producer = threading.Thread(
            target=self._produce,
            args=(scenario.writing_seconds(self.events), scenario.poison),
            name="producer",
            daemon=True,
        )
        complete = False
        try:
            scenario.start(self)
            supervisor.start()
            producer.start()
            try:
                scenario.faults(self)
            finally:
                self.faults_ended = _now()
                with self._schedule:
                    self.faults_done.set()
                    self._schedule.notify_all()
            producer.join()
            planned = self.planned_faults
            if planned and len(self.faults) != planned:
                self.extra_problems.append(
                    f"the schedule logged {len(self.faults)} faults; it plans {planned}"
                )
            if self.production_error is not None:
                raise RuntimeError(f"the producer failed: {self.production_error}")
            last_fault_end = max([f.ended for f in self.faults] + [self.production_ended])
            complete = self.wait_complete(
                COMPLETION_TIMEOUT_SECONDS, stall_seconds=scenario.stall_seconds
            )
            completed = _now()
            if not complete:
                snapshot = self.stall_snapshot()
                logger.warning("%s did not complete:\n  %s", scenario.name, "\n  ".join(snapshot))
                self.extra["stall"] = snapshot
            time.sleep(SETTLE_SECONDS)
        finally:
            stopping = _now()
            self._stop_supervisor.set()
            supervisor.join(5) if supervisor.is_alive() else None
            for process in self.processes.values():
                process.keep_alive = False
            for process in self.processes.values():
                process.stop()
        in_flight = self._in_flight_at_last_fault()
        delivered_before_last_fault = in_flight == 0
        self.extra["effects_by_process"] = self._effects_by_process()
        scenario.after(self)
        checking = _now()
        report = delivery_check(
            topic=self.topic,
            groups=[self.group],
            unreplicated_allowed=scenario.unreplicated_allowed,
        )
        self.extra["phases"] = {
            "production": round(self.production_ended - started, 1),
            "stop": round(checking - stopping, 1),
            "check": round(_now() - checking, 1),
        }
        self.extra.update(
            run_id=self.run_id,
            topic=self.topic,
            group=self.group,
            logs=str(self.log_dir),
            kills={p.name: p.kills for p in self.processes.values() if p.kills},
            killed={
                p.name: [vars(killed) for killed in p.killed]
                for p in self.processes.values()
                if p.killed
            },
            starts={p.name: p.starts for p in self.processes.values()},
            pids={p.name: p.pids for p in self.processes.values()},
            fault_log=[f.line() for f in self.faults],
            # The schedule's entries (restarts and ends of outages among them); the result's
            # "faults" counts only the faults whose effect was seen, not the checks.
            faults_logged=len(self.faults),
            faults_not_seen=[f.what for f in self.faults if f.verified is False],
            checks_seen=sum(1 for f in self.faults if f.check and f.verified),
            # Seconds from the start of the run: the writing must end after the faults.
            faults_ended=round(self.faults_ended - started, 1),
            production_ended=round(self.production_ended - started, 1),
            # How long the writers waited for the fault schedule (the schedule slower than
            # the pace of the writing), the longest of them.
            writing_waited_for_faults=round(max(self.writers_waited, default=0.0), 1),
            # Events not yet applied in the group when the last fault began (None: no fault).
            in_flight_at_last_fault=in_flight,
            # Per fault seen, the events it struck on their way (written before its end,
            # applied after its start).
            in_flight_at_faults=self._in_flight_at_faults(),
        )
        return ScenarioResult(
            name=scenario.name,
            events=self.events,
            keys=self.keys,
            report=report,
            faults=sum(1 for fault in self.faults if fault.verified and not fault.check),
            seconds=_now() - started,
            complete=complete,
            seconds_after_last_fault=(
                completed - last_fault_end if complete and not delivered_before_last_fault else None
            ),
            expect_fail=scenario.expect_fail,
            delivered_before_last_fault=delivered_before_last_fault,
            extra=self.extra,
            extra_problems=self.extra_problems,
        )


def create_topic(topic: str) -> None:
    client = faults.admin()
    futures = client.create_topics(
        [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=faults.BROKERS)],
        operation_timeout=60,
    )
    futures[topic].result(timeout=60)
    if not faults.wait_in_sync(topic, timeout=60):
        raise RuntimeError(f"topic {topic} did not get {faults.BROKERS} in-sync replicas")


def _group_positions(topic: str, group: str) -> list[str]:
    client = faults.admin()
    metadata = client.list_topics(topic, timeout=15)
    partitions = [TopicPartition(topic, p) for p in sorted(metadata.topics[topic].partitions)]
    # Read by a consumer of the group that never joins it, not the admin client: a group
    # coordinator that moved (a broker crashed) answers NOT_COORDINATOR, which kills a process
    # whose admin client reads group offsets (console.consumer_lag says why).
    reader = Consumer({"bootstrap.servers": faults.bootstrap_servers(), "group.id": group})
    try:
        committed = {tp.partition: tp.offset for tp in reader.committed(partitions, timeout=15)}
    finally:
        reader.close()
    ends = {}
    for isolation in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        futures = client.list_offsets(
            {tp: OffsetSpec.latest() for tp in partitions},
            isolation_level=isolation,
            request_timeout=15,
        )
        ends[isolation] = {tp.partition: f.result(20).offset for tp, f in futures.items()}
    lines = [
        f"partition {tp.partition}: committed {committed.get(tp.partition)}, "
        f"last stable {ends[IsolationLevel.READ_COMMITTED][tp.partition]}, "
        f"high watermark {ends[IsolationLevel.READ_UNCOMMITTED][tp.partition]}"
        for tp in partitions
    ]
    description = client.describe_consumer_groups([group])[group].result(15)
    lines.append(f"group state {description.state}")
    for member in description.members:
        assigned = sorted(tp.partition for tp in member.assignment.topic_partitions)
        lines.append(
            f"member {member.group_instance_id or member.member_id}: partitions {assigned}"
        )
    return lines


def _poison_producer() -> Producer:
    return Producer({"bootstrap.servers": faults.bootstrap_servers(), "acks": "all"})


def _produce_poison(producer: Producer, topic: str, number: int, keys: int) -> None:
    """A record no handler can take: half without an event_id header, half not JSON. It shares
    a key (and so a partition) with real events, which must flow past it."""
    key = f"k{(number * 7) % keys}".encode()
    if number % 2:
        producer.produce(
            topic,
            key=key,
            value=b'{"seq": ',
            headers=[("event_id", uuid.uuid4().bytes.hex().encode())],
        )
    else:
        producer.produce(
            topic, key=key, value=b'{"poison": true}', headers=[("event_type", EVENT_TYPE.encode())]
        )
    producer.poll(0)


# --- scenario definitions ------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    # Fault-heavy scenarios run 20,000 events at full size instead of 100,000.
    heavy: bool
    start: Callable[[Run], None]
    faults: Callable[[Run], None]
    # Events are spread over this many seconds (0: as fast as the producer can write): about
    # as long as the fault schedule usually takes, so that faults strike while events are
    # written and delivered. The writing never ends before the schedule anyway: each writer's
    # last transaction waits for it.
    production_seconds: float = 0.0
    # The entries its fault schedule logs, when their number is fixed: the writers keep no
    # more than one step ahead of them (Run._may_write). 0: only the last transaction waits.
    planned_faults: int = 0
    # The entries in runs smaller than full size (the tests'), when fewer (0: the same).
    small_planned_faults: int = 0
    poison: int = 0
    expect_fail: bool = False
    after: Callable[[Run], None] = lambda run: None
    # Delivery is given up as incomplete when nothing moved for this long.
    stall_seconds: float = 150.0
    # The events' keys, when the scenario is about them (0: the runner's --keys).
    keys: int = 0
    # The consumers' group protocol (INBOX_GROUP_PROTOCOL): classic, or consumer (KIP-848).
    group_protocol: str = "classic"
    # For a scenario whose fault lasts as long as the writing (a transaction held open while
    # events flow): production_seconds is then the writing time at full size, and a smaller
    # run writes for proportionally less, never under this. 0: the same time at every size.
    min_production_seconds: float = 0.0
    # The most events a writer's transaction holds (smaller in small runs, see Run._write).
    events_per_transaction: int = EVENTS_PER_TRANSACTION
    # The scenario's own writer, in place of the runner's (Run._write): run in each of
    # `writers` threads as write(run, writer, seconds), it writes that thread's share of the
    # run's events, spread over `seconds`, and calls run.committed() after each commit. It
    # writes no poison and keeps no pace with a fault schedule: for scenarios without one, or
    # whose schedule acts once the writing is over.
    write: Callable[["Run", int, float], None] | None = None
    writers: int = WRITERS
    # The database may fail over to a standby without every commit (asynchronous
    # replication): Kafka records of events it no longer holds are counted, not failures
    # (DeliveryReport.log_unreplicated).
    unreplicated_allowed: bool = False

    def full_events(self) -> int:
        return 20_000 if self.heavy else 100_000

    def planned_faults_at(self, events: int) -> int:
        """The entries the schedule logs in a run of `events`."""
        if self.small_planned_faults and events < self.full_events():
            return self.small_planned_faults
        return self.planned_faults

    def writing_seconds(self, events: int) -> float:
        """How long a run of `events` spreads its writing over."""
        if not self.min_production_seconds:
            return self.production_seconds
        scaled = self.production_seconds * events / self.full_events()
        return max(self.min_production_seconds, min(self.production_seconds, scaled))


def prepare_database() -> None:
    """Migrates the isolated database, empties its outbox and starts the event log afresh,
    so that the relays of this run have only its events to publish."""
    if not faults.is_isolated():
        raise RuntimeError("the scenario runner only runs against the isolated services")
    call_command("migrate", verbosity=0, interactive=False)
    OutboxEvent.objects.all().delete()
    event_log_start_afresh()


def run_scenario(
    scenario: Scenario, *, events: int, keys: int = DEFAULT_KEYS, seed: int | None = None
) -> ScenarioResult:
    return Run(scenario, events=events, keys=scenario.keys or keys, seed=seed).execute()
