"""Outbox benchmark: drain, producer and relay rates, then publish lag under load.

    .venv/bin/python benchmarks/outbox_bench.py [--events 50000] [--lag-seconds 10]

With --compare-relays it runs instead the claim relay (outbox.relay.Relay: claims rows, marks
them DONE) and the event-log relay (outbox.log_relay.LogRelay: reads events between ticks,
appends outbox_delivery rows) side by side, and prints three tables: drain rate and CPU per
key count (--skew-events), publish lag and dead tuples while another connection holds a
snapshot open (--snapshot-rate for --snapshot-seconds), and WAL bytes per event:

    .venv/bin/python benchmarks/outbox_bench.py --compare-relays \
        [--skew-events 100000] [--snapshot-seconds 180] [--snapshot-rate 800]

Runs against the real PostgreSQL and Kafka of `make services-up`, in a database of its own
(`<DATABASE name>_bench`, recreated each run) and topics of its own. Prints its figures;
asserts nothing: the targets are in the README and the closing notes.
"""

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")
os.environ["OUTBOX_NUDGE_ON_COMMIT"] = "false"

import django  # noqa: E402

if TYPE_CHECKING:
    from outbox.log_relay import LogRelay
import psycopg  # noqa: E402

from benchmarks.databases import recreate_database, sibling_database_url  # noqa: E402

BENCH_DATABASE_SUFFIX = "_bench"
PAYLOAD_BYTES = 1024
KEYS = 10_000


def payload(number: int) -> dict:
    # About 1 KB once encoded.
    return {"number": number, "seq": number // KEYS, "data": "x" * (PAYLOAD_BYTES - 40)}


def insert_events(topic: str, count: int, keys: int = KEYS) -> None:
    """Bulk-inserts PENDING events, as many publish() calls would, but fast."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic,
                                      key, status, attempts, next_attempt_at, last_error,
                                      created_at, updated_at, locked_by)
            SELECT gen_random_uuid(), 'order', 'order-' || (n %% %(keys)s), 'OrderPlaced',
                   jsonb_build_object('number', n, 'seq', n / %(keys)s,
                                      'data', repeat('x', %(filler)s)),
                   '{}'::jsonb, %(topic)s, 'order-' || (n %% %(keys)s), 'PENDING', 0, now(), '',
                   now(), now(), ''
            FROM generate_series(0, %(count)s - 1) AS n
            """,
            {"keys": keys, "filler": PAYLOAD_BYTES - 40, "topic": topic, "count": count},
        )
        # Rows a real workload adds over time (autovacuum keeps their statistics) appear
        # here at once: give the planner their statistics before the clock starts.
        cursor.execute("ANALYZE outbox_event")


def create_topic(partitions: int = 6) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    from project.kafka import kafka_connection_config

    name = f"bench.outbox.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka_connection_config())
    admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result(30)
    return name


def delete_topics(names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    from project.kafka import kafka_connection_config

    admin = AdminClient(kafka_connection_config())
    for future in admin.delete_topics(names).values():
        future.result(30)


def measure_drain(topic: str, count: int, batch_size: int) -> float:
    """Claim and mark with the relay's own statements, without Kafka."""
    from django.db import transaction
    from django.utils import timezone

    from outbox.services.claims import Delivery, outbox_events_claim, outbox_events_mark_published

    insert_events(topic, count)
    started = time.perf_counter()
    drained = 0
    while True:
        events = outbox_events_claim(relay_id="bench-drain", batch_size=batch_size)
        if not events:
            break
        now = timezone.now()
        with transaction.atomic():
            outbox_events_mark_published(
                deliveries=[
                    Delivery(event_id=e.id, partition=0, offset=i, published_at=now)
                    for i, e in enumerate(events)
                ]
            )
        drained += len(events)
    elapsed = time.perf_counter() - started
    if drained != count:
        raise RuntimeError(f"drained {drained} of {count} events")
    return count / elapsed


def measure_claim_behind_backlog(topic: str, count: int, keys: int, batch_size: int) -> float:
    """Milliseconds a claim takes when `count` events queue on `keys` keys and another relay
    holds the next event of every key: it finds nothing to take, and must find that fast."""
    from outbox.models import OutboxEvent
    from outbox.services.claims import outbox_events_claim

    insert_events(topic, count, keys)
    held = outbox_events_claim(relay_id="bench-holder", batch_size=keys)
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        taken = outbox_events_claim(relay_id="bench-late", batch_size=batch_size)
        timings.append((time.perf_counter() - started) * 1000)
        if taken:
            raise RuntimeError(f"a claim took {len(taken)} events queued behind held ones")
    OutboxEvent.objects.filter(topic=topic).delete()
    if len(held) != keys:
        raise RuntimeError(f"the holder claimed {len(held)} events, not one per key ({keys})")
    return statistics.median(timings)


def measure_producer(topic: str, count: int) -> float:
    """The raw confluent-kafka producer with the relay's settings and the same records."""
    from confluent_kafka import Producer

    from outbox.producer import producer_config

    producer = Producer(producer_config())
    values = [json.dumps(payload(n), separators=(",", ":")).encode() for n in range(count)]
    delivered = 0

    def on_delivery(error: object, message: object) -> None:
        nonlocal delivered
        if error is None:
            delivered += 1

    started = time.perf_counter()
    for number, value in enumerate(values):
        while True:
            try:
                producer.produce(
                    topic,
                    key=f"order-{number % KEYS}".encode(),
                    value=value,
                    headers=[("event_id", str(uuid.uuid4()).encode())],
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    assert delivered == count, (delivered, count)
    return count / elapsed


def measure_relay(topic: str, count: int, batch_size: int, *, transactional: bool) -> float:
    from django.conf import settings

    from outbox.models import OutboxEvent
    from outbox.producer import close_producers, get_producer
    from outbox.relay import Relay

    settings.OUTBOX_RELAY_TRANSACTIONAL = transactional
    transactional_id = f"bench-{uuid.uuid4().hex[:8]}" if transactional else None
    relay = Relay(batch_size=batch_size, transactional_id=transactional_id)
    get_producer(transactional_id=transactional_id)  # connected before the clock starts
    insert_events(topic, count)
    started = time.perf_counter()
    published = 0
    while published < count:
        result = relay.run(max_seconds=600)
        published += result.published
        if not result.claimed:
            break
    elapsed = time.perf_counter() - started
    close_producers()
    settings.OUTBOX_RELAY_TRANSACTIONAL = False
    assert not OutboxEvent.objects.filter(topic=topic).exclude(status="DONE").exists()
    return count / elapsed


PUBLISHER_PROCESSES = 4


def _publish_paced(
    topic: str,
    event_type: str,
    rate: float,
    seconds: float,
    first: int,
    costs: "multiprocessing.Queue[tuple[int, float]]",
    keys: int = KEYS,
) -> None:
    """One publisher process: `rate` events a second through outbox.publish(), 10 per
    transaction, catching up when it falls behind. Puts (events, CPU seconds spent in the
    publishing transactions) on `costs`."""
    from django.db import connection, transaction

    import outbox

    per_transaction = 10
    interval = per_transaction / rate
    started = time.perf_counter()
    next_at = started
    number = first
    published, cpu_seconds = 0, 0.0
    try:
        while time.perf_counter() - started < seconds:
            cpu_started = time.process_time()
            with transaction.atomic():
                for _ in range(per_transaction):
                    outbox.publish(
                        aggregate_type="order",
                        aggregate_id=f"order-{number % keys}",
                        event_type=event_type,
                        payload=payload(number),
                        topic=topic,
                    )
                    number += PUBLISHER_PROCESSES
            cpu_seconds += time.process_time() - cpu_started
            published += per_transaction
            next_at += interval
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    finally:
        connection.close()
        costs.put((published, cpu_seconds))


@dataclass
class OfferedLoad:
    rate: float  # events/s actually achieved
    publish_cpu_ms: float  # CPU milliseconds per event in the publishers' transactions


def offer_load(
    topic: str, rate: int, seconds: float, event_type: str = "OrderPlaced", keys: int = KEYS
) -> OfferedLoad:
    """Publishes `rate` events a second of `event_type` on `keys` keys to `topic` from
    PUBLISHER_PROCESSES processes (threads of one process share its interpreter lock and
    could not offer 1,000 events/s)."""
    from django.db import connections

    from outbox.models import OutboxEvent

    connections.close_all()  # a forked child must open its own connection
    context = multiprocessing.get_context("fork")
    costs = context.Queue()
    publishers = [
        context.Process(
            target=_publish_paced,
            args=(topic, event_type, rate / PUBLISHER_PROCESSES, seconds, number, costs, keys),
        )
        for number in range(PUBLISHER_PROCESSES)
    ]
    started = time.perf_counter()
    for publisher in publishers:
        publisher.start()
    for publisher in publishers:
        publisher.join()
    elapsed = time.perf_counter() - started
    if any(publisher.exitcode for publisher in publishers):
        raise RuntimeError("a publisher process failed")
    published = OutboxEvent.objects.filter(topic=topic, event_type=event_type).count()
    reported = [costs.get(timeout=10) for _ in publishers]
    events = sum(count for count, _ in reported) or 1
    cpu_ms = 1000 * sum(cpu for _, cpu in reported) / events
    return OfferedLoad(rate=published / elapsed, publish_cpu_ms=cpu_ms)


def warm_up(topic: str, relay: str = "claim") -> None:
    """A few events through the running relay, so that the producer knows the topic's leaders
    before the clock starts, as it would in a deployment that has been running."""
    offer_load(topic, 40, 0.5, event_type="WarmUp")
    lag_percentiles(topic, event_type="WarmUp", timeout=30, relay=relay)


# The event-log relay records each delivery in outbox_delivery and never updates the event.
LOG_UNDELIVERED_SQL = """
SELECT count(*) FROM outbox_event AS event
WHERE event.topic = %s AND event.type = %s
  AND NOT EXISTS (SELECT 1 FROM outbox_delivery AS delivery
                  WHERE delivery.event_id = event.id AND delivery.outcome = 'PUBLISHED')
"""
LOG_LAGS_SQL = """
SELECT EXTRACT(EPOCH FROM min(delivery.published_at) - event.created_at) * 1000
FROM outbox_event AS event
JOIN outbox_delivery AS delivery ON delivery.event_id = event.id AND delivery.outcome = 'PUBLISHED'
WHERE event.topic = %s AND event.type = %s
GROUP BY event.id, event.created_at
"""


def undelivered_count(topic: str, event_type: str = "OrderPlaced", relay: str = "claim") -> int:
    """Events of `event_type` on `topic` that `relay` ("claim" or "log") has not published."""
    from django.db import connection

    from outbox.models import OutboxEvent

    if relay == "claim":
        events = OutboxEvent.objects.filter(topic=topic, event_type=event_type)
        return events.exclude(status="DONE").count()
    with connection.cursor() as cursor:
        cursor.execute(LOG_UNDELIVERED_SQL, [topic, event_type])
        return int(cursor.fetchone()[0])


def publish_lags(topic: str, event_type: str = "OrderPlaced", relay: str = "claim") -> list[float]:
    """Publish lags in milliseconds, sorted, of the events `relay` has published: from the
    event's created_at to its published_at (claim) or to its first PUBLISHED delivery (log)."""
    from django.db import connection

    from outbox.models import OutboxEvent

    if relay == "claim":
        events = OutboxEvent.objects.filter(topic=topic, event_type=event_type)
        rows = events.filter(status="DONE").values_list("created_at", "published_at")
        return sorted(
            (published - created).total_seconds() * 1000
            for created, published in rows
            if published is not None
        )
    with connection.cursor() as cursor:
        cursor.execute(LOG_LAGS_SQL, [topic, event_type])
        return sorted(float(lag) for (lag,) in cursor.fetchall())


def lag_percentiles(
    topic: str, event_type: str = "OrderPlaced", timeout: float = 60, relay: str = "claim"
) -> tuple[float, float, float, int]:
    """Publish lag percentiles of the events of `event_type` on `topic`, once `relay` ("claim"
    or "log") has published them all or `timeout` seconds have passed."""
    from outbox.models import OutboxEvent

    deadline = time.monotonic() + timeout
    while undelivered_count(topic, event_type, relay):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    lags = publish_lags(topic, event_type, relay)
    not_done = OutboxEvent.objects.filter(topic=topic, event_type=event_type).count() - len(lags)
    if len(lags) < 2:
        return float("nan"), float("nan"), float("nan"), not_done
    quantiles = statistics.quantiles(lags, n=100, method="inclusive")
    return quantiles[49], quantiles[98], lags[-1], not_done


def report_lag(
    mode: str, offered: OfferedLoad, p50: float, p99: float, worst: float, missing: int
) -> None:
    print(
        f"  {mode:<30}{offered.rate:6.0f} events/s  p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
        f"  max {worst:7.1f} ms  not done {missing}"
        f"  publish() {offered.publish_cpu_ms:.2f} ms CPU/event"
    )


def start(
    command: list[str], environment: dict[str, str], output: Path | None = None
) -> subprocess.Popen:
    """Starts `command` in a session of its own; its output goes to `output`, or nowhere."""
    if output is None:
        return subprocess.Popen(
            command,
            cwd=BASE_DIR,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("wb") as sink:
        return subprocess.Popen(
            command,
            cwd=BASE_DIR,
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)


# The side-by-side comparison of the claim relay (outbox.relay.Relay) and the event-log relay
# (outbox.log_relay.LogRelay): --compare-relays.

CLAIM, LOG = "claim", "log"
SKEW_KEYS = (1, 10, 100, 10_000)
# The claim relay takes one event per key per claim: on one key it drains 20 to 50 events/s
# (the deeper the backlog, the slower), and 100,000 events would take an hour.
CLAIM_DRAIN_CAP_SECONDS = 60.0
# A safety limit only: the event-log relay is expected to drain long before it.
LOG_DRAIN_CAP_SECONDS = 600.0
WAL_EVENTS = 2000
WAL_ROUNDS = 3
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RELAY_OUTPUT_DIR = BASE_DIR / ".local" / "outbox-bench"


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far (0 once it has gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # Fields after the command name, which may hold spaces: state is field 3, utime 14, stime 15.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def database_backend_pids() -> list[int]:
    """The backends serving this database's clients (the relay's connections among them),
    WAL senders included; autovacuum and the server's own processes excluded."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT pid FROM pg_stat_activity
            WHERE datname = current_database()
              AND backend_type IN ('client backend', 'walsender')
            """
        )
        return [pid for (pid,) in cursor.fetchall()]


class CpuMeter:
    """CPU seconds of this process (time.process_time(): every thread, librdkafka's too) and
    of PostgreSQL: the backend of django.db.connection, plus any other backend of this
    database (a relay may hold connections of its own), read from /proc/<pid>/stat."""

    def __enter__(self) -> "CpuMeter":
        from django.db import connection

        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.relay_backend = int(cursor.fetchone()[0])
        self.backends = {pid: process_cpu_seconds(pid) for pid in database_backend_pids()}
        self.backends.setdefault(self.relay_backend, process_cpu_seconds(self.relay_backend))
        self.started = time.perf_counter()
        self.process_started = time.process_time()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.process = time.process_time() - self.process_started
        self.elapsed = time.perf_counter() - self.started
        ended = {pid: process_cpu_seconds(pid) for pid in database_backend_pids()}
        ended.setdefault(self.relay_backend, process_cpu_seconds(self.relay_backend))
        # A backend that appeared meanwhile counts from zero; one that has gone is lost.
        self.database = sum(
            cpu - self.backends.get(pid, 0.0) for pid, cpu in ended.items() if cpu > 0
        )
        self.relay_database = ended[self.relay_backend] - self.backends[self.relay_backend]


def clear_outbox() -> None:
    """Empties the outbox and starts the event log afresh (deliveries, held events, ticks and
    cursors), so that each run starts on an empty table without dead tuples, neither relay
    finds the other's events, and either may start (each refuses a database the other has
    been sending)."""
    from django.db import connection

    from outbox.services.event_log import event_log_start_afresh

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE outbox_event")
    event_log_start_afresh()


def dead_tuples(table: str = "outbox_event") -> int:
    """n_dead_tup of `table`, once this backend's statistics are flushed (others flush theirs
    at most a second after their last transaction)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_proc WHERE proname = 'pg_stat_force_next_flush'")
        if cursor.fetchone():
            cursor.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(1)
        cursor.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", [table])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def log_undelivered(topic: str) -> int:
    """Events on `topic` without a PUBLISHED delivery."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM outbox_event AS event
            WHERE event.topic = %s
              AND NOT EXISTS (SELECT 1 FROM outbox_delivery AS delivery
                              WHERE delivery.event_id = event.id
                                AND delivery.outcome = 'PUBLISHED')
            """,
            [topic],
        )
        return int(cursor.fetchone()[0])


def log_delivery_counts(topic: str) -> tuple[int, int]:
    """(events on `topic` without a PUBLISHED delivery, deliveries beyond the first of an
    event): what the event-log relay missed and what it sent twice."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) - count(DISTINCT delivery.event_id)
            FROM outbox_delivery AS delivery
            JOIN outbox_event AS event ON event.id = delivery.event_id
            WHERE event.topic = %s AND delivery.outcome = 'PUBLISHED'
            """,
            [topic],
        )
        return log_undelivered(topic), int(cursor.fetchone()[0])


@dataclass
class Drain:
    relay: str
    keys: int
    events: int
    published: int
    seconds: float
    process_cpu: float
    database_cpu: float
    capped: float | None = None  # the cap in seconds, when the drain hit it
    missing: int = 0
    duplicates: int = 0
    # Runs of the event-log relay that ended "drained" while events were still unsent.
    early_drains: int = 0

    @property
    def rate(self) -> float:
        return self.published / self.seconds if self.seconds else float("nan")

    def cpu_ms_per_thousand(self, seconds: float) -> float:
        return 1_000_000 * seconds / self.published if self.published else float("nan")


def drain_with_claim_relay(topic: str, count: int, keys: int, batch_size: int) -> Drain:
    """The claim relay in this process on `count` events over `keys` keys, until all are DONE
    or CLAIM_DRAIN_CAP_SECONDS have passed."""
    from outbox.models import OutboxEvent
    from outbox.producer import close_producers, get_producer
    from outbox.relay import Relay

    relay = Relay(batch_size=batch_size)
    get_producer()  # connected before the clock starts
    insert_events(topic, count, keys)
    pending = OutboxEvent.objects.filter(topic=topic).exclude(status="DONE")
    published, capped = 0, None
    with CpuMeter() as cpu:
        while True:
            remaining = CLAIM_DRAIN_CAP_SECONDS - (time.perf_counter() - cpu.started)
            if remaining <= 0:
                capped = CLAIM_DRAIN_CAP_SECONDS
                break
            result = relay.run(max_seconds=remaining)
            published += result.published
            if result.drained:
                if not pending.exists():
                    break
                time.sleep(0.1)  # failed events wait for their retry
    close_producers()
    return Drain(CLAIM, keys, count, published, cpu.elapsed, cpu.process, cpu.database, capped)


def drain_with_log_relay(topic: str, count: int, keys: int, batch_size: int) -> Drain:
    """The event-log relay in this process on `count` events over `keys` keys, until a run
    ends drained."""
    from outbox.log_relay import LogRelay
    from outbox.producer import close_producers, get_producer

    relay = LogRelay(batch_size=batch_size)
    try:
        get_producer()
        insert_events(topic, count, keys)
        published, capped, early_drains = 0, None, 0
        with CpuMeter() as cpu:
            while True:
                remaining = LOG_DRAIN_CAP_SECONDS - (time.perf_counter() - cpu.started)
                if remaining <= 0:
                    capped = LOG_DRAIN_CAP_SECONDS
                    break
                result = relay.run(max_seconds=remaining)
                published += result.published
                if result.drained:
                    if not log_undelivered(topic):
                        break
                    early_drains += 1
    finally:
        # After a failure the session may be unusable; the failure is what is reported.
        with contextlib.suppress(Exception):
            relay.close()
        close_producers()
    drain = Drain(LOG, keys, count, published, cpu.elapsed, cpu.process, cpu.database, capped)
    drain.missing, drain.duplicates = log_delivery_counts(topic)
    drain.early_drains = early_drains
    return drain


def report_drain(drain: Drain, claim: Drain | None) -> None:
    ratio = f"{drain.rate / claim.rate:.1f}" if claim is not None and claim.rate else ""
    notes = []
    if drain.published != drain.events:
        notes.append(f"published {drain.published:,} of {drain.events:,}")
    if drain.capped:
        notes.append(f"(capped at {drain.capped:.0f} s)")
    if drain.missing or drain.duplicates:
        notes.append(f"undelivered {drain.missing:,}, sent twice {drain.duplicates:,}")
    if drain.early_drains:
        notes.append(f"{drain.early_drains} runs said drained with events left")
    print(
        f"  {drain.keys:>6,}  {drain.relay:<6}{drain.rate:>10,.0f}{ratio:>11}"
        f"{drain.cpu_ms_per_thousand(drain.process_cpu):>11.0f}"
        f"{drain.cpu_ms_per_thousand(drain.database_cpu):>9.0f}  {' '.join(notes)}",
        flush=True,
    )


def compare_key_skew(count: int, batch_size: int, topics: list[str]) -> None:
    print()
    print(
        f"1. key skew: {count:,} events of {PAYLOAD_BYTES} B on 1 to 10,000 keys, 6 partitions,"
        f" batch {batch_size}, each relay in this process"
    )
    print(
        f"  {'keys':>6}  {'relay':<6}{'events/s':>10}{'log/claim':>11}"
        f"{'relay CPU':>11}{'PG CPU':>9}  (CPU: ms per 1,000 events)",
        flush=True,
    )
    for keys in SKEW_KEYS:
        clear_outbox()
        topics.append(create_topic())
        claim = drain_with_claim_relay(topics[-1], count, keys, batch_size)
        report_drain(claim, None)
        clear_outbox()  # the events a capped claim relay left
        topics.append(create_topic())
        report_drain(drain_with_log_relay(topics[-1], count, keys, batch_size), claim)
        clear_outbox()


@dataclass
class SnapshotRun:
    relay: str
    held: bool
    offered: OfferedLoad
    events: int
    left: int  # not yet published at the end of the offer + 10 s
    dead_tuples: int
    p50: float
    p99: float
    worst: float
    never: int  # still not published a minute after the snapshot was released
    errors: list[str]


def hold_snapshot(url: str) -> psycopg.Connection:
    """Another client's long REPEATABLE READ transaction: its snapshot keeps every row version
    deleted or updated after it from being vacuumed while it is open."""
    holder = psycopg.connect(url, autocommit=False)
    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    holder.execute("SELECT count(*) FROM outbox_event").fetchone()
    return holder


def relay_output_errors(output: Path) -> list[str]:
    """The lines of a relay's output that tell of an error or a traceback."""
    if not output.exists():
        return []
    lines = output.read_text(errors="replace").splitlines()
    return [line for line in lines if "Traceback" in line or "ERROR" in line or "Error" in line]


def measure_snapshot_run(
    relay: str,
    held: bool,
    rate: int,
    seconds: float,
    url: str,
    environment: dict[str, str],
    topics: list[str],
    keys: int = KEYS,
    drain_seconds: float = 60,
) -> SnapshotRun:
    """The long-running relay `relay` in a subprocess, under `rate` events/s on `keys` keys
    for `seconds`, while another connection holds a snapshot open (or not); the lags are
    read once all is published or `drain_seconds` after the offer."""
    from outbox.models import OutboxEvent

    clear_outbox()
    topics.append(create_topic())
    topic = topics[-1]
    command = [sys.executable, "manage.py", "outbox_relay", "--poll-seconds", "1"]
    if relay == LOG:
        command.append("--log")
    output = RELAY_OUTPUT_DIR / f"{relay}-{'held' if held else 'free'}-{keys}-keys.log"
    # The relay is chosen here, whatever the settings' default.
    environment = {**environment, "OUTBOX_RELAY_LOG": "true" if relay == LOG else "false"}
    process = start(command, environment, output)
    holder = None
    try:
        time.sleep(3)
        warm_up(topic, relay)
        if held:
            holder = hold_snapshot(url)
        offered = offer_load(topic, rate, seconds, keys=keys)
        offer_ended = time.monotonic()
        time.sleep(max(0.0, offer_ended + 10 - time.monotonic()))
        left = undelivered_count(topic, relay=relay)
        dead = dead_tuples()
        if holder is not None:
            holder.close()
            holder = None
        p50, p99, worst, never = lag_percentiles(topic, timeout=drain_seconds, relay=relay)
        events = OutboxEvent.objects.filter(topic=topic, event_type="OrderPlaced").count()
    finally:
        if holder is not None:
            holder.close()
        stop(process)
    return SnapshotRun(
        relay,
        held,
        offered,
        events,
        left,
        dead,
        p50,
        p99,
        worst,
        never,
        relay_output_errors(output),
    )


def compare_held_snapshot(
    relays: list[str],
    rate: int,
    seconds: float,
    url: str,
    environment: dict[str, str],
    topics: list[str],
) -> None:
    print()
    print(
        f"2. held snapshot: `outbox_relay --poll-seconds 1` (--log for the event-log relay) in a"
        f" subprocess, {rate} events/s offered for {seconds:.0f} s"
    )
    print(
        "   (10 events per transaction), with and without another connection holding a"
        " REPEATABLE READ snapshot open"
    )
    print(
        "   throughout; 'left' = not published at the end of the offer + 10 s; lag over all"
        " events once published"
    )
    print("   after the snapshot's release; dead tuples of outbox_event at the end + 10 s.")
    print(
        f"  {'relay':<6}{'snapshot':<10}{'offered/s':>10}{'events':>9}{'left':>9}"
        f"{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'dead tuples':>13}"
    )
    runs = [
        measure_snapshot_run(relay, held, rate, seconds, url, environment, topics)
        for held in (False, True)
        for relay in relays
    ]
    for run in sorted(runs, key=lambda run: (run.relay != CLAIM, run.held)):
        notes = []
        if run.never:
            notes.append(f"{run.never:,} never published")
        if run.errors:
            notes.append(f"{len(run.errors)} error lines in the relay's output")
        print(
            f"  {run.relay:<6}{'held' if run.held else 'none':<10}{run.offered.rate:>10,.0f}"
            f"{run.events:>9,}{run.left:>9,}{run.p50:>10,.0f}{run.p99:>10,.0f}"
            f"{run.worst:>10,.0f}{run.dead_tuples:>13,}  {' '.join(notes)}"
        )
    for run in runs:
        for line in run.errors[:5]:
            print(f"  {run.relay}, snapshot {'held' if run.held else 'none'}: {line}")
    print(f"  (the relays' output: {RELAY_OUTPUT_DIR})")


def compare_one_key_lag(
    rate: int, seconds: float, url: str, environment: dict[str, str], topics: list[str]
) -> None:
    print()
    print(
        f"4. one key: `outbox_relay --poll-seconds 1` (--log for the event-log relay) in a"
        f" subprocess, {rate} events/s on ONE key offered for {seconds:.0f} s (10 events per"
    )
    print(
        "   transaction); 'left' = not published at the end of the offer + 10 s; lag over the"
        " events published"
    )
    print("   within 10 s more (the claim relay sends one event of a key per claim).")
    print(
        f"  {'relay':<6}{'offered/s':>10}{'events':>9}{'left':>9}"
        f"{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}  never published"
    )
    for relay in (CLAIM, LOG):
        run = measure_snapshot_run(
            relay, False, rate, seconds, url, environment, topics, keys=1, drain_seconds=10
        )
        print(
            f"  {run.relay:<6}{run.offered.rate:>10,.0f}{run.events:>9,}{run.left:>9,}"
            f"{run.p50:>10,.0f}{run.p99:>10,.0f}{run.worst:>10,.0f}  {run.never:,}"
        )
        for line in run.errors[:5]:
            print(f"  {run.relay}: {line}")


def wal_lsn() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()::text")
        return str(cursor.fetchone()[0])


def wal_bytes_since(lsn: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", [lsn])
        return int(cursor.fetchone()[0])


@dataclass
class WalCost:
    bytes_per_event: float
    ms_per_event: float


def wal_of(action: Callable[[], int]) -> WalCost:
    """WAL written (by the whole server: other databases' writes count too) and wall time while
    `action` runs, per event it reports."""
    started_lsn = wal_lsn()
    started = time.perf_counter()
    events = action()
    elapsed = time.perf_counter() - started
    written = wal_bytes_since(started_lsn)
    if not events:
        return WalCost(float("nan"), float("nan"))
    return WalCost(written / events, 1000 * elapsed / events)


def insert_bare(count: int) -> int:
    """`count` single-row transactions into bench_bare (a uuid primary key and the payload)."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        for number in range(count):
            with transaction.atomic():
                cursor.execute(
                    "INSERT INTO bench_bare (id, payload) VALUES (%s, %s::jsonb)",
                    [uuid.uuid4(), json.dumps(payload(number))],
                )
    return count


def publish_one_per_transaction(topic: str, count: int) -> int:
    from django.db import transaction

    import outbox

    for number in range(count):
        with transaction.atomic():
            outbox.publish(
                aggregate_type="order",
                aggregate_id=f"order-{number % KEYS}",
                event_type="OrderPlaced",
                payload=payload(number),
                topic=topic,
            )
    return count


def deliver_with_claim_relay(batch_size: int) -> int:
    from outbox.relay import Relay

    relay, published = Relay(batch_size=batch_size), 0
    while True:
        result = relay.run(max_seconds=600)
        published += result.published
        if result.drained:
            return published


def deliver_with_log_relay(relay: "LogRelay", topic: str) -> int:
    """Runs the event-log relay until a run ends drained with nothing of `topic` left."""
    published, deadline = 0, time.monotonic() + LOG_DRAIN_CAP_SECONDS
    while time.monotonic() < deadline:
        result = relay.run(max_seconds=600)
        published += result.published
        if result.drained and not log_undelivered(topic):
            break
    return published


def compare_wal(batch_size: int, topics: list[str]) -> None:
    from django.db import connection

    from outbox.log_relay import LogRelay
    from outbox.producer import close_producers, get_producer

    count = WAL_EVENTS
    print()
    print(
        f"3. WAL per event: {count:,} events of {PAYLOAD_BYTES} B, one per transaction, in one"
        f" session; median of {WAL_ROUNDS} rounds (min)"
    )
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_bare")
        cursor.execute("CREATE TABLE bench_bare (id uuid PRIMARY KEY, payload jsonb)")
    idle_lsn = wal_lsn()
    time.sleep(3)
    idle = wal_bytes_since(idle_lsn) / 3
    costs: dict[str, list[WalCost]] = {}
    get_producer()
    for _ in range(WAL_ROUNDS):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE bench_bare")
        costs.setdefault("bare", []).append(wal_of(partial(insert_bare, count)))
        clear_outbox()
        topics.append(create_topic())
        topic = topics[-1]
        relay = LogRelay(batch_size=batch_size)
        try:
            published = wal_of(partial(publish_one_per_transaction, topic, count))
            delivered = wal_of(partial(deliver_with_log_relay, relay, topic))
        finally:
            relay.close()
        costs.setdefault("publish", []).append(published)
        costs.setdefault("log", []).append(delivered)
        missing, duplicates = log_delivery_counts(topic)
        if missing or duplicates:
            print(f"  log relay: {missing} events undelivered, {duplicates} sent twice")
        clear_outbox()
        topics.append(create_topic())
        topic = topics[-1]
        costs.setdefault("publish", []).append(
            wal_of(partial(publish_one_per_transaction, topic, count))
        )
        costs.setdefault("claim", []).append(wal_of(partial(deliver_with_claim_relay, batch_size)))
        clear_outbox()
    close_producers()
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_bare")

    def median(name: str, attribute: str) -> float:
        return statistics.median(getattr(cost, attribute) for cost in costs[name])

    def least(name: str) -> float:
        return min(cost.bytes_per_event for cost in costs[name])

    bare_bytes, bare_ms = median("bare", "bytes_per_event"), median("bare", "ms_per_event")
    print(f"  {'':<44}{'WAL B/event':>12}{'(min)':>9}{'/ bare':>8}{'ms/event':>10}{'/ bare':>8}")

    def row(label: str, names: list[str], timed: bool) -> None:
        wal = sum(median(name, "bytes_per_event") for name in names)
        lowest = sum(least(name) for name in names)
        timing = ""
        if timed:
            ms = sum(median(name, "ms_per_event") for name in names)
            timing = f"{ms:>10.3f}{ms / bare_ms:>8.2f}"
        print(f"  {label:<44}{wal:>12,.0f}{lowest:>9,.0f}{wal / bare_bytes:>8.2f}{timing}")

    row("(a) bare insert into bench_bare", ["bare"], timed=True)
    row("(b) outbox.publish()", ["publish"], timed=True)
    row("(c) log relay delivery", ["log"], timed=False)
    row("(d) claim relay delivery", ["claim"], timed=False)
    row("    publish + log relay delivery (b + c)", ["publish", "log"], timed=False)
    row("    publish + claim relay delivery (b + d)", ["publish", "claim"], timed=False)
    log = sum(median(name, "bytes_per_event") for name in ("publish", "log"))
    claim = sum(median(name, "bytes_per_event") for name in ("publish", "claim"))
    print(f"  {'(b + c) / (b + d)':<44}{log / claim:>12.2f}")
    print(f"  WAL the server wrote while idle beforehand: {idle:,.0f} B/s (counted in the above)")


def compare_relays(options: argparse.Namespace, url: str, environment: dict[str, str]) -> None:
    """--compare-relays: the claim relay and the event-log relay side by side."""
    from django.conf import settings

    database = settings.DATABASES["default"]["NAME"]
    print(
        f"outbox relays compared: claim relay (outbox.relay.Relay) and event-log relay"
        f" (outbox.log_relay.LogRelay); database {database}, Kafka"
        f" {settings.KAFKA_BOOTSTRAP_SERVERS}"
    )
    topics: list[str] = []
    parts = set(options.only or ("skew", "snapshot", "wal", "one-key"))
    try:
        if "skew" in parts:
            compare_key_skew(options.skew_events, options.batch_size, topics)
        if "snapshot" in parts:
            compare_held_snapshot(
                [CLAIM, LOG],
                options.snapshot_rate,
                options.snapshot_seconds,
                url,
                environment,
                topics,
            )
        if "wal" in parts:
            compare_wal(options.batch_size, topics)
        if "one-key" in parts:
            compare_one_key_lag(options.lag_rate, options.one_key_seconds, url, environment, topics)
    finally:
        delete_topics(topics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lag-rate", type=int, default=1000, help="offered load, events/s")
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    parser.add_argument("--keep-database", action="store_true", help="reuse its database")
    parser.add_argument("--rates-only", action="store_true", help="skip the publish lag runs")
    parser.add_argument(
        "--compare-relays",
        action="store_true",
        help="only the claim relay and the event-log relay side by side: key skew, held "
        "snapshot, WAL per event",
    )
    parser.add_argument(
        "--skew-events", type=int, default=100_000, help="events per key count (key skew)"
    )
    parser.add_argument(
        "--snapshot-seconds", type=float, default=180.0, help="offered load's length (snapshot)"
    )
    parser.add_argument(
        "--snapshot-rate", type=int, default=800, help="offered load, events/s (snapshot)"
    )
    parser.add_argument(
        "--one-key-seconds", type=float, default=30.0, help="offered load's length (one key)"
    )
    parser.add_argument(
        "--only",
        choices=("skew", "snapshot", "wal", "one-key"),
        action="append",
        help="with --compare-relays: run only these parts (repeatable)",
    )
    options = parser.parse_args()

    url = sibling_database_url(BENCH_DATABASE_SUFFIX)
    if not options.keep_database:
        recreate_database(url)
    os.environ["DATABASE_URL"] = url
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    python = sys.executable
    child_environment = {**os.environ, "DATABASE_URL": url}
    if options.compare_relays:
        compare_relays(options, url, child_environment)
        return
    count, batch = options.events, options.batch_size
    print(f"outbox benchmark: {count} events of {PAYLOAD_BYTES} B, batch {batch}, {KEYS} keys")
    database = settings.DATABASES["default"]["NAME"]
    print(f"database {database}, Kafka {settings.KAFKA_BOOTSTRAP_SERVERS}")

    topics = [create_topic() for _ in range(6)]
    try:
        drain = measure_drain(topics[0], count, batch)
        blocked_claim = measure_claim_behind_backlog(topics[0], 100_000, 1_000, batch)
        producer = measure_producer(topics[1], count)
        relay = measure_relay(topics[2], count, batch, transactional=False)
        transactional = measure_relay(topics[3], count, batch, transactional=True)
        print()
        print(f"{'raw SQL drain (claim + mark, no Kafka)':<44}{drain:>10,.0f} events/s")
        print(f"{'raw confluent-kafka producer':<44}{producer:>10,.0f} events/s")
        print(f"{'claim relay':<44}{relay:>10,.0f} events/s")
        print(f"{'claim relay, transactional mode':<44}{transactional:>10,.0f} events/s")
        print(f"{'claim relay / drain':<44}{relay / drain:>10.2f}")
        print(f"{'claim relay / producer':<44}{relay / producer:>10.2f}")
        print(f"{'transactional / plain relay':<44}{transactional / relay:>10.2f}")
        print(
            f"{'claim behind 100,000 events on 1,000 keys':<44}{blocked_claim:>10.0f} ms"
            "  (their next events held by another relay)"
        )

        if options.rates_only:
            return
        print()
        # The relay the settings choose (OUTBOX_RELAY_LOG), in the processes started below.
        lag_relay = LOG if settings.OUTBOX_RELAY_LOG else CLAIM
        print(
            f"publish lag at {options.lag_rate} events/s offered for {options.lag_seconds:.0f} s"
            f" ({lag_relay} relay):"
        )
        relay_process = start(
            [python, "manage.py", "outbox_relay", "--poll-seconds", "1"], child_environment
        )
        time.sleep(3)
        warm_up(topics[4], lag_relay)
        offered = offer_load(topics[4], options.lag_rate, options.lag_seconds)
        p50, p99, worst, missing = lag_percentiles(topics[4], relay=lag_relay)
        stop(relay_process)
        report_lag("outbox_relay (LISTEN/NOTIFY)", offered, p50, p99, worst, missing)

        beat_environment = {
            **child_environment,
            "OUTBOX_NUDGE_ON_COMMIT": "true",
            "OUTBOX_RELAY_INTERVAL": "1",
        }
        worker = start(
            [
                python,
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                "--concurrency",
                "2",
                "-Q",
                "celery",
            ],
            beat_environment,
        )
        beat = start(
            [
                python,
                "-m",
                "celery",
                "-A",
                "project",
                "beat",
                "-s",
                str(BASE_DIR / ".local" / "outbox-bench-beat"),
            ],
            beat_environment,
        )
        time.sleep(8)
        settings.OUTBOX_NUDGE_ON_COMMIT = True
        warm_up(topics[5], lag_relay)
        offered = offer_load(topics[5], options.lag_rate, options.lag_seconds)
        settings.OUTBOX_NUDGE_ON_COMMIT = False
        p50, p99, worst, missing = lag_percentiles(topics[5], relay=lag_relay)
        stop(beat)
        stop(worker)
        report_lag("Celery beat (1 s) + nudge", offered, p50, p99, worst, missing)
    finally:
        delete_topics(topics)


if __name__ == "__main__":
    main()
