"""The scenario runner: N events on K keys with per-key sequence numbers, written through
outbox.publish in transactions while relays, consumers and Celery run as `manage.py`
subprocesses and a fault schedule strikes; then it waits for delivery to complete and runs
the delivery checker.

Runs in a process whose settings point at the isolated services (scenarios/faults.py);
the `scenario_run` command makes sure of it."""

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
from pathlib import Path
from typing import IO, Any

from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import NewTopic, OffsetSpec
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

import outbox
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from scenarios import faults
from scenarios.checker import DeliveryReport, delivery_check
from scenarios.conf import AGGREGATE_TYPE, EVENT_TYPE, GROUP_VARIABLE, RUN_VARIABLE, TOPIC_VARIABLE
from scenarios.models import ScenarioEffect

logger = logging.getLogger(__name__)

PARTITIONS = 6
EVENTS_PER_TRANSACTION = 100
# Threads writing events, each for its own keys.
WRITERS = 4
# How long delivery may take to complete after the last fault before the run gives up.
COMPLETION_TIMEOUT_SECONDS = 600.0
# After completion, how long to keep the consumers running so a late duplicate shows up.
SETTLE_SECONDS = 3.0
STOP_TIMEOUT_SECONDS = 30.0
RESTART_DELAY_SECONDS = 0.5


def _now() -> float:
    return time.monotonic()


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
            start_new_session=True,
        )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive and self.process is not None:
            if signum == signal.SIGKILL:
                self.kills += 1
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL; the supervisor starts it again."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)
        self.restart_after = _now() + RESTART_DELAY_SECONDS

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        self.keep_alive = False
        if self.process is None:
            return
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

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


@dataclass
class ScenarioResult:
    name: str
    events: int
    keys: int
    report: DeliveryReport
    faults: int
    seconds: float
    complete: bool
    # Delivery complete, counted from the end of the last fault (or of production, if later).
    seconds_after_last_fault: float | None
    expect_fail: bool = False
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
        self.keys = keys
        self.random = random.Random(seed)
        self.run_id = f"{datetime.now(UTC):%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}"
        self.topic = f"scenario.{scenario.name}.{self.run_id}"
        self.group = f"scenario-{scenario.name}-{self.run_id}"
        self.log_dir = faults.local_dir() / "runs" / f"{scenario.name}-{self.run_id}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, Managed] = {}
        self.faults: list[Fault] = []
        self.extra: dict[str, Any] = {}
        self.extra_problems: list[str] = []
        self.production_done = threading.Event()
        self.production_ended = 0.0
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
        env_extra = options.pop("env", {})
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
        config = "session.timeout.ms=10000,heartbeat.interval.ms=1000"
        if static:
            # Static membership: a restarted consumer takes its slot back at once instead of
            # waiting out the session of the one that was killed.
            config += f",group.instance.id={self.group}-{index}"
        env = {"INBOX_CONSUMER_CONFIG": config, **options.pop("env", {})}
        argv = options.pop("argv", None) or [
            sys.executable,
            "manage.py",
            "inbox_consume",
            "--group",
            self.group,
        ]
        return self.add(f"consumer-{index}", argv, env=env, **options)

    def add_celery_worker(self, index: int = 1, **options: Any) -> Managed:
        return self.add(
            f"worker-{index}",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                "--loglevel",
                "WARNING",
                "--concurrency",
                "2",
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
                "--loglevel",
                "WARNING",
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

    def fault(self, what: str, action: Callable[[], object] | None = None) -> Fault:
        """Runs `action` and logs it as one fault, from its start to its end."""
        started, started_at = _now(), datetime.now(UTC)
        if action is not None:
            action()
        fault = Fault(what, started, _now(), started_at, datetime.now(UTC))
        self.faults.append(fault)
        return fault

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    # Producing events ----------------------------------------------------------------------

    def _publish_batch(self, numbers: list[int]) -> None:
        """Publishes one transaction of events. A transaction whose commit may or may not
        have happened (the database crashed under it) is retried for the events that are
        missing, found by their number, so no event is written twice."""
        while True:
            try:
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
                connection.close()
                time.sleep(0.5)

    def _write(self, writer: int, seconds: float, poison: int) -> None:
        """One writer: the events of the keys k with k % WRITERS == writer, in order. One
        writer per key keeps each key's events in the order of their sequence numbers."""
        try:
            numbers = [n for n in range(self.events) if (n % self.keys) % WRITERS == writer]
            started = _now()
            poison_producer = _poison_producer() if poison else None
            poisoned = 0
            for first in range(0, len(numbers), EVENTS_PER_TRANSACTION):
                batch = numbers[first : first + EVENTS_PER_TRANSACTION]
                self._publish_batch(batch)
                done = first + len(batch)
                while poison_producer and poisoned < poison * done // len(numbers):
                    _produce_poison(poison_producer, self.topic, poisoned, self.keys)
                    poisoned += 1
                if seconds:
                    # Spread the events over `seconds`, so that faults strike while they flow.
                    ahead = started + seconds * done / len(numbers) - _now()
                    if ahead > 0:
                        time.sleep(ahead)
            if poison_producer is not None:
                while poisoned < poison:
                    _produce_poison(poison_producer, self.topic, poisoned, self.keys)
                    poisoned += 1
                poison_producer.flush(60)
                self.extra["poison_records"] = poisoned
        except BaseException as error:
            self.production_error = error
            raise
        finally:
            connection.close()

    def _produce(self, seconds: float, poison: int) -> None:
        writers = [
            threading.Thread(
                target=self._write,
                args=(writer, seconds, poison if writer == 0 else 0),
                name=f"writer-{writer}",
                daemon=True,
            )
            for writer in range(WRITERS)
        ]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        self.production_ended = _now()
        self.production_done.set()

    # Completion ----------------------------------------------------------------------------

    def _progress(self) -> tuple[int, int] | None:
        try:
            pending = OutboxEvent.objects.filter(topic=self.topic).exclude(status="DONE").count()
            applied = (
                ScenarioEffect.objects.filter(consumer_group=self.group)
                .values("event_id")
                .distinct()
                .count()
            )
            return pending, applied
        except DatabaseError:
            connection.close()
            return None

    def wait_complete(self, timeout: float, *, stall_seconds: float) -> bool:
        """Waits until every event is DONE in the outbox and applied in the group. Gives up
        after `timeout`, or when nothing has moved for `stall_seconds` (longer than a relay's
        lease, which holds back the rows of a killed relay)."""
        deadline = _now() + timeout
        last, moved = None, _now()
        while _now() < deadline and _now() - moved < stall_seconds:
            progress = self._progress()
            if progress is not None and progress == (0, self.events):
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

    def inbox_not_done(self) -> int:
        return InboxMessage.objects.filter(consumer_group=self.group).exclude(status="DONE").count()

    # The run ---------------------------------------------------------------------------------

    def execute(self) -> ScenarioResult:
        scenario = self.scenario
        _create_topic(self.topic)
        started = _now()
        supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        producer = threading.Thread(
            target=self._produce,
            args=(scenario.production_seconds, scenario.poison),
            name="producer",
            daemon=True,
        )
        complete = False
        try:
            scenario.start(self)
            supervisor.start()
            producer.start()
            scenario.faults(self)
            producer.join()
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
        scenario.after(self)
        checking = _now()
        report = delivery_check(topic=self.topic, groups=[self.group])
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
            starts={p.name: p.starts for p in self.processes.values()},
            fault_log=[
                f"{f.started_at:%H:%M:%S.%f}"[:-3] + f" +{f.ended - f.started:.1f}s {f.what}"
                for f in self.faults
            ],
        )
        return ScenarioResult(
            name=scenario.name,
            events=self.events,
            keys=self.keys,
            report=report,
            faults=len(self.faults),
            seconds=_now() - started,
            complete=complete,
            seconds_after_last_fault=(completed - last_fault_end) if complete else None,
            expect_fail=scenario.expect_fail,
            extra=self.extra,
            extra_problems=self.extra_problems,
        )


def _create_topic(topic: str) -> None:
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
    request = ConsumerGroupTopicPartitions(group, partitions)
    committed = {
        tp.partition: tp.offset
        for tp in client.list_consumer_group_offsets([request])[group].result(15).topic_partitions
        or []
    }
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
    return Producer({"bootstrap.servers": faults.BOOTSTRAP_SERVERS, "acks": "all"})


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
    # Events are spread over this many seconds (0: as fast as the producer can write).
    production_seconds: float = 0.0
    poison: int = 0
    expect_fail: bool = False
    after: Callable[[Run], None] = lambda run: None
    # Delivery is given up as incomplete when nothing moved for this long.
    stall_seconds: float = 150.0

    def full_events(self) -> int:
        return 20_000 if self.heavy else 100_000


def prepare_database() -> None:
    """Migrates the isolated database and clears what aborted runs left undelivered there,
    so that the relays of this run have only its events to publish."""
    if not faults.is_isolated():
        raise RuntimeError("the scenario runner only runs against the isolated services")
    call_command("migrate", verbosity=0, interactive=False)
    OutboxEvent.objects.exclude(status="DONE").delete()


def run_scenario(
    scenario: Scenario, *, events: int, keys: int = 1000, seed: int | None = None
) -> ScenarioResult:
    return Run(scenario, events=events, keys=keys, seed=seed).execute()
