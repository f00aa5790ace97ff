"""Outbox benchmark: the relay's rates and publish lag, then key skew, a held snapshot, WAL
per event, one hot key and a writer idle in its transaction.

    .venv/bin/python benchmarks/outbox_bench.py [--only PART ...] [size options]

Nine parts, each a table; --only runs the parts named (repeatable), always in this order:
  rates     the raw confluent-kafka producer and the relay (outbox.log_relay.LogRelay) in this
            process, plain and transactional, on --events events (the relay's rates and this
            process's CPU per 1,000 events, librdkafka's threads included); with --tracing,
            also the relay with tracing off (opentelemetry-api only, no SDK) and on (the SDK
            at 100 % sampling, a batch span processor, an exporter that drops the spans),
            their events carrying a traceparent: the best rate and CPU µs per event of each
            over 3 alternated runs, and the ratios on/off;
  secured   the relay in this process on --events events through the broker's PLAINTEXT
            listener and through its SASL_SSL one (TLS with the project's CA, SCRAM-SHA-512,
            a user whose ACLs allow it to write the topic), alternated 3 times: the best rate
            and CPU µs per event of each, and secured / plain against issue 43's 0.8;
  relays    a backlog of --relays-events events drained by one `outbox_relay` process, then
            by two that share the shards: events/s from the backlog's COMMIT to its last
            delivery record, and the CPU per 1,000 events of the relay processes and of their
            PostgreSQL backends;
  lag       publish lag at --lag-rate events/s on 10,000 keys for --lag-seconds, with
            `outbox_relay` and with Celery beat + nudge;
  skew      (a) the relay draining --skew-events events of 1 KB on 1, 10, 100 and 10,000 keys:
            events/s, relay and PostgreSQL CPU per 1,000 events, each rate as a ratio of the
            10,000-key rate;
  snapshot  (b) `outbox_relay` under --snapshot-rate events/s for --snapshot-seconds, with and
            without another session holding a REPEATABLE READ snapshot open: events left,
            publish lag p50/p99/max, dead tuples of outbox_event, and held/free p99; the
            longest part (two runs of the offer + 10 s);
  wal       (c) WAL bytes per event over its life (publish, delivery record, retention purge
            and the vacuum after it) beside a bare single-row insert of the same payload, and
            publish alone against the bare insert in WAL and time;
  one-key   (d) `outbox_relay` at --lag-rate events/s on ONE key for --one-key-seconds.
  idle-writer
            (e) issue 42's targets: `outbox_relay` under 800 events/s for
            --idle-writer-seconds (default 600), with nothing held and with another session
            idle in a transaction that holds a transaction id (`BEGIN; SELECT
            pg_current_xact_id();`, as a writer between its first write and its COMMIT), its
            state and xid read from pg_stat_activity at the start and at the end: events
            offered and left, publish lag p50/p99, the p99 ratio idle writer / none, then
            PASS or FAIL for 0 left, p99 <= 100 ms and an idle writer's p99 within 1.5 x;
            the longest part (two runs of the offer + 10 s).
All of them (the default) at the default sizes take about 36 minutes. A short smoke run that
proves every part runs:

    .venv/bin/python benchmarks/outbox_bench.py --events 5000 --lag-seconds 5
        --skew-events 10000 --snapshot-seconds 20 --wal-events 500 --one-key-seconds 20
        --idle-writer-seconds 20 --relays-events 20000

Runs against the real PostgreSQL and Kafka of `make services-up`, in a database of its own
(`<DATABASE name>_bench`, recreated each run) and topics of its own. Prints its figures for a
person to read (docs/outbox.md, Benchmark); the idle-writer part alone checks targets, and the
exit code is 1 when one of them is missed.
"""

import argparse
import contextlib
import gc
import json
import math
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
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")
os.environ["OUTBOX_NUDGE_ON_COMMIT"] = "false"
# As in production: with DEBUG on, Django logs every statement of this process and of the
# relays it starts, and publish() gives up its prepared INSERT to show the values in that log.
os.environ.setdefault("DEBUG", "false")

import django  # noqa: E402

if TYPE_CHECKING:
    from multiprocessing.context import ForkProcess
    from multiprocessing.sharedctypes import Synchronized

    from outbox.log_relay import LogRelay
import psycopg  # noqa: E402

from benchmarks.databases import recreate_database, sibling_database_url  # noqa: E402
from benchmarks.tracing import (  # noqa: E402
    SAMPLED_ONE_IN,
    TRACING_ROUNDS,
    Measured,
    print_comparison,
    tracing_on,
)

BENCH_DATABASE_SUFFIX = "_bench"
PAYLOAD_BYTES = 1024
KEYS = 10_000
PARTS = (
    "rates",
    "secured",
    "relays",
    "lag",
    "skew",
    "snapshot",
    "wal",
    "one-key",
    "idle-writer",
)


def payload(number: int) -> dict:
    # About 1 KB once encoded.
    return {"number": number, "seq": number // KEYS, "data": "x" * (PAYLOAD_BYTES - 40)}


# The creation context of the events of the tracing runs: a request's, as publish() stores it.
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def insert_events(
    topic: str,
    count: int,
    keys: int = KEYS,
    *,
    traceparent: str | None = None,
    sampled_one_in: int = 1,
) -> None:
    """Bulk-inserts events as many publish() calls would write them, but fast: in one
    transaction, so the relay reads them as one (its batches still hold --batch-size).
    With `traceparent`, each event carries it as publish() stores a caller's: sampled (flags
    01) for one event in `sampled_one_in`, the others not (00), as a root sampler at that
    ratio leaves them."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic,
                                      key, created_at)
            SELECT gen_random_uuid(), 'order', 'order-' || (n %% %(keys)s), 'OrderPlaced',
                   jsonb_build_object('number', n, 'seq', n / %(keys)s,
                                      'data', repeat('x', %(filler)s)),
                   CASE WHEN %(unflagged)s::text IS NULL THEN '{}'::jsonb
                        ELSE jsonb_build_object('traceparent', %(unflagged)s::text || CASE
                             WHEN n %% %(sampled_one_in)s = 0 THEN '01' ELSE '00' END) END,
                   %(topic)s, 'order-' || (n %% %(keys)s), now()
            FROM generate_series(0, %(count)s - 1) AS n
            """,
            {
                "keys": keys,
                "filler": PAYLOAD_BYTES - 40,
                "topic": topic,
                "count": count,
                "unflagged": traceparent[:-2] if traceparent else None,
                "sampled_one_in": sampled_one_in,
            },
        )
        # Rows a real workload adds over time (autovacuum keeps their statistics) appear
        # here at once: give the planner their statistics before the clock starts.
        cursor.execute("ANALYZE outbox_event")


def create_topic(partitions: int = 6) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    from kafka_events.kafka import kafka_connection_config

    name = f"bench.outbox.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka_connection_config())
    admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result(30)
    return name


def delete_topics(names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    from kafka_events.kafka import kafka_connection_config

    admin = AdminClient(kafka_connection_config())
    for future in admin.delete_topics(names).values():
        future.result(30)


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


def new_relay(batch_size: int, transactional_id: str | None = None) -> "LogRelay":
    from outbox.log_relay import LogRelay

    return LogRelay(batch_size=batch_size, transactional_id=transactional_id)


# A safety limit only: the relay is expected to drain long before it.
DRAIN_CAP_SECONDS = 600.0


def deliver_with_relay(relay: "LogRelay", topic: str) -> int:
    """Runs the relay until a run ends drained with nothing of `topic` left (or
    DRAIN_CAP_SECONDS have passed); returns how many events it published."""
    published, deadline = 0, time.monotonic() + DRAIN_CAP_SECONDS
    while time.monotonic() < deadline:
        result = relay.run(max_seconds=600)
        published += result.published
        if result.drained and not undelivered(topic):
            break
    return published


def measure_relay(
    topic: str,
    count: int,
    batch_size: int,
    *,
    transactional: bool,
    traceparent: str | None = None,
    sampled_one_in: int = 1,
) -> Measured:
    """The relay in this process on `count` events on KEYS keys, plain or with one Kafka
    transaction per batch: its rate, and this process's CPU over the drain alone (not the
    insert of the events)."""
    from outbox.producer import close_producers, get_producer

    transactional_id = f"bench-{uuid.uuid4().hex[:8]}" if transactional else None
    relay = new_relay(batch_size, transactional_id)
    try:
        get_producer(transactional_id=transactional_id)  # connected before the clock starts
        insert_events(topic, count, traceparent=traceparent, sampled_one_in=sampled_one_in)
        started, cpu_started = time.perf_counter(), time.process_time()
        published = deliver_with_relay(relay, topic)
        cpu_seconds = time.process_time() - cpu_started
        elapsed = time.perf_counter() - started
    finally:
        with contextlib.suppress(Exception):
            relay.close()
        close_producers()
    missing, duplicates = delivery_counts(topic)
    if published != count or missing or duplicates:
        print(
            f"  relay: published {published:,} of {count:,}; {missing:,} undelivered,"
            f" {duplicates:,} sent twice"
        )
    return Measured(rate=count / elapsed, cpu_us_per_event=1_000_000 * cpu_seconds / count)


PUBLISHER_PROCESSES = 4


def _publish_paced(
    topic: str,
    event_type: str,
    rate: float,
    seconds: float,
    first: int,
    costs: "multiprocessing.Queue[PublisherReport]",
    keys: int = KEYS,
    load: "Load | None" = None,
) -> None:
    """One publisher process: `rate` events a second through outbox.publish(),
    `load.per_transaction` per transaction, catching up when it falls behind. Puts its
    PublisherReport on `costs`."""
    from django.db import connection, transaction

    import outbox

    load = load or Load()
    interval = load.per_transaction / rate
    started = time.perf_counter()
    next_at = started
    number = first
    published, cpu_seconds = 0, 0.0
    commits: list[Commit] = []
    try:
        while time.perf_counter() - started < seconds:
            cpu_started = time.process_time()
            first_number = number
            with transaction.atomic():
                for _ in range(load.per_transaction):
                    outbox.publish(
                        aggregate_type=load.aggregate_type,
                        aggregate_id=f"{load.aggregate_type}-{number % keys}",
                        event_type=event_type,
                        payload=load.payload(number),
                        topic=topic,
                    )
                    number += load.processes
                committing = time.perf_counter()
            if load.time_commits:
                commits.append(
                    Commit(
                        first_number=first_number,
                        returned_at=time.time(),
                        seconds=time.perf_counter() - committing,
                    )
                )
            cpu_seconds += time.process_time() - cpu_started
            published += load.per_transaction
            if load.committed is not None:
                with load.committed.get_lock():
                    load.committed.value += load.per_transaction
            next_at += interval
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    finally:
        connection.close()
        costs.put(PublisherReport(published, cpu_seconds, commits))


@dataclass
class Load:
    """What the publishers write, and how many processes write it: events per transaction,
    the aggregate type (also the prefix of the keys), each event's payload by its number, a
    counter shared by the processes that each committed transaction adds its events to (None:
    not counted), and whether to time each transaction's COMMIT."""

    processes: int = PUBLISHER_PROCESSES
    per_transaction: int = 10
    aggregate_type: str = "order"
    payload: Callable[[int], dict] = payload
    committed: "Synchronized[int] | None" = None
    time_commits: bool = False


@dataclass(frozen=True)
class Commit:
    """One publishing transaction's COMMIT: the number of its first event (the others follow
    by the number of processes), when the COMMIT returned (time.time()) and how long it took.
    PostgreSQL makes a transaction visible only once its WAL is on disk, so a slow flush
    delays its events' publishing before any relay can see them."""

    first_number: int
    returned_at: float
    seconds: float


@dataclass
class PublisherReport:
    published: int
    cpu_seconds: float  # spent in the publishing transactions
    commits: list[Commit]


@dataclass
class OfferedLoad:
    rate: float  # events/s actually achieved
    publish_cpu_ms: float  # CPU milliseconds per event in the publishers' transactions
    commits: list[Commit]  # empty unless the load timed them


def start_publishers(
    topic: str,
    rate: float,
    seconds: float,
    event_type: str = "OrderPlaced",
    keys: int = KEYS,
    load: Load | None = None,
) -> tuple[list["ForkProcess"], "multiprocessing.Queue[PublisherReport]"]:
    """Starts `load.processes` forked processes that publish `rate` events a second of
    `event_type` on `keys` keys to `topic` for `seconds` (threads of one process share its
    interpreter lock and could not offer 1,000 events/s). Returns them and the queue each
    puts its PublisherReport on when it ends. Call before this process starts a thread
    or a Kafka client of its own: a forked child has none of their threads."""
    from django.db import connections

    connections.close_all()  # a forked child must open its own connection
    # A closed relay producer waits in a reference cycle for the garbage collector: collected
    # in a forked child, which has none of librdkafka's threads, it crashes the child.
    gc.collect()
    context = multiprocessing.get_context("fork")
    costs = context.Queue()
    load = load or Load()
    publishers = [
        context.Process(
            target=_publish_paced,
            args=(topic, event_type, rate / load.processes, seconds, number, costs, keys),
            kwargs={"load": load},
        )
        for number in range(load.processes)
    ]
    for publisher in publishers:
        publisher.start()
    return publishers, costs


def offer_load(
    topic: str,
    rate: int,
    seconds: float,
    event_type: str = "OrderPlaced",
    keys: int = KEYS,
    load: Load | None = None,
) -> OfferedLoad:
    """Publishes `rate` events a second of `event_type` on `keys` keys to `topic` from
    `load.processes` processes, and waits for them."""
    from django.db import connections

    from outbox.models import OutboxEvent

    # Done again in start_publishers, at no cost then: the clock counts the processes alone.
    connections.close_all()
    gc.collect()
    started = time.perf_counter()
    publishers, costs = start_publishers(topic, rate, seconds, event_type, keys, load)
    # Read before the joins: a process whose report is still in its queue's pipe cannot exit.
    reported: list[PublisherReport] = [costs.get(timeout=seconds + 60) for _ in publishers]
    for publisher in publishers:
        publisher.join()
    elapsed = time.perf_counter() - started
    if any(publisher.exitcode for publisher in publishers):
        codes = [publisher.exitcode for publisher in publishers]
        raise RuntimeError(f"a publisher process failed (exit codes {codes})")
    published = OutboxEvent.objects.filter(topic=topic, event_type=event_type).count()
    events = sum(report.published for report in reported) or 1
    cpu_ms = 1000 * sum(report.cpu_seconds for report in reported) / events
    commits = [commit for report in reported for commit in report.commits]
    return OfferedLoad(rate=published / elapsed, publish_cpu_ms=cpu_ms, commits=commits)


def warm_up(topic: str) -> None:
    """A few events through the running relay, so that the producer knows the topic's leaders
    before the clock starts, as it would in a deployment that has been running."""
    offer_load(topic, 40, 0.5, event_type="WarmUp")
    lag_percentiles(topic, event_type="WarmUp", timeout=30)


# The relay records each delivery in outbox_delivery and never updates the event.
UNDELIVERED_SQL = """
SELECT count(*) FROM outbox_event AS event
WHERE event.topic = %(topic)s AND (%(type)s::text IS NULL OR event.type = %(type)s)
  AND NOT EXISTS (SELECT 1 FROM outbox_delivery AS delivery
                  WHERE delivery.event_id = event.id AND delivery.outcome = 'PUBLISHED')
"""
# The optional bounds let a caller measure while the load runs: the events published within
# a window, among those created since a time (on partitions by time, the rest is not read).
LAGS_SQL = """
SELECT EXTRACT(EPOCH FROM min(delivery.published_at) - event.created_at) * 1000
FROM outbox_event AS event
JOIN outbox_delivery AS delivery ON delivery.event_id = event.id AND delivery.outcome = 'PUBLISHED'
WHERE event.topic = %(topic)s AND event.type = %(type)s
  AND (%(created_from)s::timestamptz IS NULL OR event.created_at >= %(created_from)s)
  AND (%(published_from)s::timestamptz IS NULL OR delivery.published_at >= %(published_from)s)
  AND (%(published_before)s::timestamptz IS NULL OR delivery.published_at < %(published_before)s)
GROUP BY event.id, event.created_at
"""


def undelivered(topic: str, event_type: str | None = None) -> int:
    """Events on `topic` (of `event_type`, or of any type) without a PUBLISHED delivery."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(UNDELIVERED_SQL, {"topic": topic, "type": event_type})
        return int(cursor.fetchone()[0])


def delivery_counts(topic: str) -> tuple[int, int]:
    """(events on `topic` without a PUBLISHED delivery, deliveries beyond the first of an
    event): what the relay missed and what it sent twice."""
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
        return undelivered(topic), int(cursor.fetchone()[0])


def publish_lags(
    topic: str,
    event_type: str = "OrderPlaced",
    *,
    created_from: datetime | None = None,
    published_from: datetime | None = None,
    published_before: datetime | None = None,
) -> list[float]:
    """Publish lags in milliseconds, sorted, of the published events of `event_type` on
    `topic`: from the event's created_at to its first PUBLISHED delivery. With the bounds,
    of the events created at or after `created_from` whose delivery records fall in
    [`published_from`, `published_before`)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            LAGS_SQL,
            {
                "topic": topic,
                "type": event_type,
                "created_from": created_from,
                "published_from": published_from,
                "published_before": published_before,
            },
        )
        return sorted(float(lag) for (lag,) in cursor.fetchall())


# The numbers of the published events of a type (payload()'s "number") and when each was first
# published, in seconds since the epoch.
PUBLISHED_AT_SQL = """
SELECT (event.payload ->> 'number')::bigint,
       EXTRACT(EPOCH FROM min(delivery.published_at))::float8
FROM outbox_event AS event
JOIN outbox_delivery AS delivery ON delivery.event_id = event.id AND delivery.outcome = 'PUBLISHED'
WHERE event.topic = %(topic)s AND event.type = %(type)s
GROUP BY event.id, event.payload
"""


def lags_from_commits(
    topic: str, commits: list[Commit], load: Load, event_type: str = "OrderPlaced"
) -> list[float]:
    """Publish lags in milliseconds, sorted, from the return of each event's COMMIT (the
    publisher's clock, the relay's, one machine) to its first PUBLISHED delivery: the part of
    the lag after its transaction became visible. Slightly negative for an event the relay
    published before its publisher had read the COMMIT's answer."""
    from django.db import connection

    committed_at = {
        commit.first_number + index * load.processes: commit.returned_at
        for commit in commits
        for index in range(load.per_transaction)
    }
    with connection.cursor() as cursor:
        cursor.execute(PUBLISHED_AT_SQL, {"topic": topic, "type": event_type})
        return sorted(
            1000 * (published_at - committed_at[number])
            for number, published_at in cursor.fetchall()
            if number in committed_at
        )


def lag_percentiles(
    topic: str, event_type: str = "OrderPlaced", timeout: float = 60
) -> tuple[float, float, float, int]:
    """Publish lag p50, p99 and max of the events of `event_type` on `topic`, and how many
    are not published, once all are or `timeout` seconds have passed."""
    from outbox.models import OutboxEvent

    deadline = time.monotonic() + timeout
    while undelivered(topic, event_type):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    lags = publish_lags(topic, event_type)
    not_done = OutboxEvent.objects.filter(topic=topic, event_type=event_type).count() - len(lags)
    if len(lags) < 2:
        return float("nan"), float("nan"), float("nan"), not_done
    return *p50_p99(lags), lags[-1], not_done


def p50_p99(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return float("nan"), float("nan")
    quantiles = statistics.quantiles(values, n=100, method="inclusive")
    return quantiles[49], quantiles[98]


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


SKEW_KEYS = (1, 10, 100, 10_000)
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
    cursors), so that each run starts on an empty table without dead tuples. The partitions
    are left as outbox.services.partitions creates them: TRUNCATE rebuilds their BRIN indexes
    with a summary of the first range, which a new partition has not."""
    from django.db import connection

    from outbox.services.event_log.cursors import event_log_start_afresh
    from outbox.services.partitions import DESUMMARIZE_FIRST_RANGE_SQL, partitions_read

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE outbox_event")
        for partition in partitions_read(table="outbox_event"):
            cursor.execute(DESUMMARIZE_FIRST_RANGE_SQL, [partition.name])
    event_log_start_afresh()


def dead_tuples(table: str = "outbox_event") -> int:
    """n_dead_tup of `table` (partitioned or not) and its partitions, once this backend's
    statistics are flushed (others flush theirs at most a second after their last
    transaction)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_proc WHERE proname = 'pg_stat_force_next_flush'")
        if cursor.fetchone():
            cursor.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(1)
        cursor.execute(
            """
            SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
            WHERE relid IN (SELECT relid FROM pg_partition_tree(%(table)s::regclass)
                            UNION SELECT %(table)s::regclass)
            """,
            {"table": table},
        )
        return int(cursor.fetchone()[0])


@dataclass
class Drain:
    keys: int
    events: int
    published: int
    seconds: float
    process_cpu: float
    database_cpu: float
    capped: float | None = None  # the cap in seconds, when the drain hit it
    missing: int = 0
    duplicates: int = 0
    # Runs of the relay that ended "drained" while events were still unsent.
    early_drains: int = 0

    @property
    def rate(self) -> float:
        return self.published / self.seconds if self.seconds else float("nan")

    def cpu_ms_per_thousand(self, seconds: float) -> float:
        return 1_000_000 * seconds / self.published if self.published else float("nan")


def drain_with_relay(topic: str, count: int, keys: int, batch_size: int) -> Drain:
    """The relay in this process on `count` events over `keys` keys, until a run ends
    drained with nothing left (or DRAIN_CAP_SECONDS have passed)."""
    from outbox.producer import close_producers, get_producer

    relay = new_relay(batch_size)
    try:
        get_producer()  # connected before the clock starts
        insert_events(topic, count, keys)
        published, capped, early_drains = 0, None, 0
        with CpuMeter() as cpu:
            while True:
                remaining = DRAIN_CAP_SECONDS - (time.perf_counter() - cpu.started)
                if remaining <= 0:
                    capped = DRAIN_CAP_SECONDS
                    break
                result = relay.run(max_seconds=remaining)
                published += result.published
                if result.drained:
                    if not undelivered(topic):
                        break
                    early_drains += 1
    finally:
        # After a failure the session may be unusable; the failure is what is reported.
        with contextlib.suppress(Exception):
            relay.close()
        close_producers()
    drain = Drain(keys, count, published, cpu.elapsed, cpu.process, cpu.database, capped)
    drain.missing, drain.duplicates = delivery_counts(topic)
    drain.early_drains = early_drains
    return drain


def report_drain(drain: Drain, reference: float) -> None:
    """One row of the key skew table; `reference` is the 10,000-key rate."""
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
        f"  {drain.keys:>6,}{drain.rate:>10,.0f}{drain.rate / reference:>15.2f}"
        f"{drain.cpu_ms_per_thousand(drain.process_cpu):>11.0f}"
        f"{drain.cpu_ms_per_thousand(drain.database_cpu):>9.0f}  {' '.join(notes)}"
    )


RELAY_PROCESSES = (1, 2)
SHARES_SETTLE_SECONDS = 60.0


def shard_owners() -> list[int]:
    """How many shards each session holding shard locks holds, most first."""
    from django.db import connection

    from outbox.services.event_log.shards import SHARD_LOCK_CLASS

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM pg_locks
            WHERE locktype = 'advisory' AND classid = %s::bigint::oid AND objsubid = 2
              AND granted
            GROUP BY pid ORDER BY count(*) DESC
            """,
            [SHARD_LOCK_CLASS],
        )
        return [count for (count,) in cursor.fetchall()]


def relay_processes(count: int, environment: dict[str, str], topics: list[str]) -> None:
    """A backlog of `count` events drained by one `outbox_relay` process, then by two that
    share the shards: the rate from the backlog's COMMIT to its last delivery record, and
    the CPU of the relay processes and of their PostgreSQL backends."""
    from outbox.services.event_log.shards import SHARD_COUNT

    print()
    print(
        f"relays: a backlog of {count:,} events of {PAYLOAD_BYTES} B on {KEYS:,} keys, 6"
        f" partitions, drained by `outbox_relay` processes sharing the shards",
        flush=True,
    )
    print(
        f"  {'relays':>6}{'events/s':>10}{'/ one':>7}{'relay CPU':>11}{'PG CPU':>9}"
        "  (CPU: ms per 1,000 events, every relay process and its backend)"
    )
    python = sys.executable
    one = 0.0
    for processes in RELAY_PROCESSES:
        clear_outbox()
        topics.append(create_topic())
        relays = [
            start([python, "manage.py", "outbox_relay", "--poll-seconds", "1"], environment)
            for _ in range(processes)
        ]
        try:
            # Each relay owns its share before the backlog commits.
            deadline = time.monotonic() + SHARES_SETTLE_SECONDS
            share = SHARD_COUNT // processes
            while (owners := shard_owners()) != [share] * processes:
                if time.monotonic() > deadline:
                    print(f"  {processes} relays: shards held {owners}, not {share} each")
                    break
                time.sleep(0.2)
            relay_cpu = sum(process_cpu_seconds(relay.pid) for relay in relays)
            with CpuMeter() as meter:
                insert_events(topics[-1], count)
                committed = time.perf_counter()
                while undelivered(topics[-1]) and time.perf_counter() - committed < 600:
                    time.sleep(0.05)
                elapsed = time.perf_counter() - committed
                relay_cpu = sum(process_cpu_seconds(relay.pid) for relay in relays) - relay_cpu
        finally:
            for relay in relays:
                stop(relay)
        missing, duplicates = delivery_counts(topics[-1])
        if missing or duplicates:
            print(f"  {processes} relays: {missing:,} undelivered, {duplicates:,} sent twice")
        rate = count / elapsed
        one = one or rate
        # This process's backend wrote the backlog and polled for its end: not the relays'.
        relays_database = meter.database - meter.relay_database
        print(
            f"  {processes:>6}{rate:>10,.0f}{rate / one:>7.2f}"
            f"{1000 * relay_cpu / count * 1000:>11,.0f}"
            f"{1000 * relays_database / count * 1000:>9,.0f}"
        )
    clear_outbox()


def key_skew(count: int, batch_size: int, topics: list[str]) -> None:
    print()
    print(
        f"(a) key skew: {count:,} events of {PAYLOAD_BYTES} B on 1 to 10,000 keys, 6 partitions,"
        f" batch {batch_size}, the relay in this process",
        flush=True,
    )
    drains: dict[int, Drain] = {}
    for keys in SKEW_KEYS:
        clear_outbox()
        topics.append(create_topic())
        drains[keys] = drain_with_relay(topics[-1], count, keys, batch_size)
        clear_outbox()
    reference = drains[max(SKEW_KEYS)].rate
    print(
        f"  {'keys':>6}{'events/s':>10}{'/ 10,000 keys':>15}"
        f"{'relay CPU':>11}{'PG CPU':>9}  (CPU: ms per 1,000 events)"
    )
    for keys in SKEW_KEYS:
        report_drain(drains[keys], reference)


@dataclass(frozen=True)
class HolderActivity:
    """The holding session's row of pg_stat_activity: its backend's pid, its state, its
    transaction id (None before it takes one) and the xmin of its snapshot (None between
    statements of READ COMMITTED), and the age in transactions of each."""

    pid: int
    state: str
    backend_xid: str | None
    backend_xmin: str | None
    xid_age: int | None
    xmin_age: int | None

    def __str__(self) -> str:
        return (
            f"state '{self.state}', backend_xid {self.backend_xid} (age {self.xid_age}),"
            f" backend_xmin {self.backend_xmin} (age {self.xmin_age})"
        )


def holder_activity(holder: psycopg.Connection) -> HolderActivity:
    """Read from this process's connection: a statement of the holder's own would show it
    'active'."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT pid, state, backend_xid::text, backend_xmin::text, age(backend_xid),
                   age(backend_xmin)
            FROM pg_stat_activity WHERE pid = %s
            """,
            [holder.info.backend_pid],
        )
        row = cursor.fetchone()
    if row is None:
        return HolderActivity(holder.info.backend_pid, "gone", None, None, None, None)
    return HolderActivity(*row)


@dataclass
class OfferedRun:
    offered: OfferedLoad
    events: int
    left: int  # not yet published at the end of the offer + 10 s
    dead_tuples: int
    p50: float
    p99: float
    worst: float
    never: int  # still not published a minute after the holder was released
    errors: list[str]
    # The publishers' COMMITs in ms (p50, p99, max), and the lag from their return (p50, p99).
    commit_ms: tuple[float, float, float]
    from_commit: tuple[float, float]
    # The holder's pg_stat_activity once it holds, and at the end of the offer + 10 s.
    holder_activity: tuple[HolderActivity, HolderActivity] | None

    COMMIT_HEADER = f"{'COMMIT p50':>12}{'p99':>7}{'max':>7}{'from COMMIT p50':>17}{'p99':>7}"

    def commit_columns(self) -> str:
        return (
            f"{self.commit_ms[0]:>12,.1f}{self.commit_ms[1]:>7,.1f}{self.commit_ms[2]:>7,.0f}"
            f"{self.from_commit[0]:>17,.1f}{self.from_commit[1]:>7,.1f}"
        )


COMMIT_NOTE = (
    "   COMMIT: the publishers' COMMITs in ms, each waiting for its WAL to reach the disk"
    " before PostgreSQL shows\n"
    "   its events to any reader; from COMMIT: the publish lag from the COMMIT's return, the"
    " part after the events became visible."
)


def hold_snapshot(url: str) -> psycopg.Connection:
    """Another client's long REPEATABLE READ transaction: its snapshot keeps every row version
    deleted or updated after it from being vacuumed while it is open."""
    holder = psycopg.connect(url, autocommit=False)
    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    holder.execute("SELECT count(*) FROM outbox_event").fetchone()
    return holder


def hold_transaction_id(url: str) -> psycopg.Connection:
    """Another client's writer idle in its transaction after taking a transaction id (as its
    first write would): READ COMMITTED, so it keeps no snapshot, but its xid stays running,
    in every snapshot's xip list, until it ends. Closing it rolls it back."""
    holder = psycopg.connect(url, autocommit=False)
    holder.execute("SELECT pg_current_xact_id()").fetchone()
    return holder


def relay_output_errors(output: Path) -> list[str]:
    """The lines of a relay's output that tell of an error or a traceback."""
    if not output.exists():
        return []
    lines = output.read_text(errors="replace").splitlines()
    return [line for line in lines if "Traceback" in line or "ERROR" in line or "Error" in line]


def measure_offered_run(
    part: str,
    hold: Callable[[str], psycopg.Connection] | None,
    rate: int,
    seconds: float,
    url: str,
    environment: dict[str, str],
    topics: list[str],
    keys: int = KEYS,
    drain_seconds: float = 60,
) -> OfferedRun:
    """The long-running relay (`outbox_relay`) in a subprocess, under `rate` events/s on `keys`
    keys for `seconds`, while another connection opened by `hold` (hold_snapshot,
    hold_transaction_id) holds its transaction open, or with nothing held; the lags are read
    once the holder is released and all is published, or `drain_seconds` after that. The
    relay's output goes to RELAY_OUTPUT_DIR, in a file named after `part` and the holder."""
    from outbox.models import OutboxEvent

    clear_outbox()
    topics.append(create_topic())
    topic = topics[-1]
    command = [sys.executable, "manage.py", "outbox_relay", "--poll-seconds", "1"]
    output = RELAY_OUTPUT_DIR / f"relay-{part}-{hold.__name__ if hold else 'nothing'}.log"
    process = start(command, environment, output)
    holder = None
    holding = activity = None
    try:
        time.sleep(3)
        warm_up(topic)
        if hold is not None:
            holder = hold(url)
            holding = holder_activity(holder)
        load = Load(time_commits=True)
        offered = offer_load(topic, rate, seconds, keys=keys, load=load)
        offer_ended = time.monotonic()
        time.sleep(max(0.0, offer_ended + 10 - time.monotonic()))
        left = undelivered(topic, "OrderPlaced")
        dead = dead_tuples()
        if holder is not None and holding is not None:
            activity = (holding, holder_activity(holder))
            holder.close()
            holder = None
        p50, p99, worst, never = lag_percentiles(topic, timeout=drain_seconds)
        events = OutboxEvent.objects.filter(topic=topic, event_type="OrderPlaced").count()
        commit_times_ms = sorted(1000 * commit.seconds for commit in offered.commits)
        commit_ms = (
            *p50_p99(commit_times_ms),
            commit_times_ms[-1] if commit_times_ms else math.nan,
        )
        from_commit = p50_p99(lags_from_commits(topic, offered.commits, load))
    finally:
        if holder is not None:
            holder.close()
        stop(process)
    return OfferedRun(
        offered,
        events,
        left,
        dead,
        p50,
        p99,
        worst,
        never,
        relay_output_errors(output),
        commit_ms,
        from_commit,
        activity,
    )


def print_offered_runs(heading: str, runs: dict[str, OfferedRun]) -> None:
    """A table of runs of measure_offered_run, a row for each under its label, then the first
    error lines of each run's relay output."""
    width = max(len(heading), *(len(label) for label in runs)) + 2
    print(
        f"  {heading:<{width}}{'offered/s':>10}{'events':>9}{'left':>9}"
        f"{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'dead tuples':>13}"
        f"{OfferedRun.COMMIT_HEADER}"
    )
    for label, run in runs.items():
        notes = []
        if run.never:
            notes.append(f"{run.never:,} never published")
        if run.errors:
            notes.append(f"{len(run.errors)} error lines in the relay's output")
        print(
            f"  {label:<{width}}{run.offered.rate:>10,.0f}"
            f"{run.events:>9,}{run.left:>9,}{run.p50:>10,.1f}{run.p99:>10,.1f}"
            f"{run.worst:>10,.1f}{run.dead_tuples:>13,}{run.commit_columns()}"
            f"  {' '.join(notes)}"
        )
    for label, run in runs.items():
        for line in run.errors[:5]:
            print(f"  {heading} {label}: {line}")
    print(f"  (the relay's output: {RELAY_OUTPUT_DIR})")


def held_snapshot(
    rate: int, seconds: float, url: str, environment: dict[str, str], topics: list[str]
) -> None:
    print()
    print(
        f"(b) held snapshot: `outbox_relay --poll-seconds 1` in a subprocess, {rate} events/s"
        f" on {KEYS:,} keys offered for {seconds:.0f} s"
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
    print(COMMIT_NOTE, flush=True)
    runs = [
        measure_offered_run("snapshot", hold, rate, seconds, url, environment, topics)
        for hold in (None, hold_snapshot)
    ]
    free, held = runs
    print_offered_runs("snapshot", {"none": free, "held": held})
    print(f"  p99 held / free: {held.p99 / free.p99:.2f}")


def one_key_lag(
    rate: int, seconds: float, url: str, environment: dict[str, str], topics: list[str]
) -> None:
    print()
    print(
        f"(d) one key: `outbox_relay --poll-seconds 1` in a subprocess, {rate} events/s on ONE"
        f" key offered for {seconds:.0f} s (10 events"
    )
    print(
        "   per transaction); 'left' = not published at the end of the offer + 10 s; lag over"
        " the events published within 10 s more."
    )
    print(COMMIT_NOTE, flush=True)
    run = measure_offered_run(
        "one-key", None, rate, seconds, url, environment, topics, keys=1, drain_seconds=10
    )
    print(
        f"  {'offered/s':>10}{'events':>9}{'left':>9}"
        f"{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{OfferedRun.COMMIT_HEADER}  never published"
    )
    print(
        f"  {run.offered.rate:>10,.0f}{run.events:>9,}{run.left:>9,}"
        f"{run.p50:>10,.1f}{run.p99:>10,.1f}{run.worst:>10,.1f}{run.commit_columns()}"
        f"  {run.never:,}"
    )
    for line in run.errors[:5]:
        print(f"  {line}")
    print(f"  (the relay's output: {RELAY_OUTPUT_DIR})")


# Issue 42: a writer idle in its transaction must not slow the relay.
IDLE_WRITER_RATE = 800  # events/s offered
IDLE_WRITER_P99_MS = 100.0
IDLE_WRITER_P99_RATIO = 1.5  # the idle writer's p99 over the p99 with nothing held, at most
# Below this share of IDLE_WRITER_RATE the publishers did not offer the load: the lag flatters.
OFFERED_SHARE = 0.95


def idle_writer(seconds: float, url: str, environment: dict[str, str], topics: list[str]) -> bool:
    """Issue 42's targets side by side: returns whether every one was met."""
    rate = IDLE_WRITER_RATE
    print()
    print(
        f"(e) idle writer: `outbox_relay --poll-seconds 1` in a subprocess, {rate} events/s on"
        f" {KEYS:,} keys offered for {seconds:.0f} s"
    )
    print(
        "   (10 events per transaction), (a) with nothing held, (b) with another connection"
        " idle in a transaction that"
    )
    print(
        "   holds a transaction id throughout (BEGIN; SELECT pg_current_xact_id();); 'left' ="
        " not published at the end of"
    )
    print(
        "   the offer + 10 s, the writer still idle; lag over all events once published after"
        " its rollback; dead tuples"
    )
    print("   of outbox_event at the end + 10 s.")
    print(COMMIT_NOTE, flush=True)
    free, idle = (
        measure_offered_run("idle-writer", hold, rate, seconds, url, environment, topics)
        for hold in (None, hold_transaction_id)
    )
    print_offered_runs("held", {"(a) nothing": free, "(b) idle xid": idle})
    assert idle.holder_activity is not None
    at_start, at_end = idle.holder_activity
    print(f"  (b)'s writer, backend pid {at_start.pid}, in pg_stat_activity:")
    print(f"    at the start: {at_start}")
    print(f"    at the end:   {at_end}")
    ratio = idle.p99 / free.p99
    print(f"  p99 (b) / (a): {ratio:.2f}")
    for label, run in (("(a)", free), ("(b)", idle)):
        if run.offered.rate < OFFERED_SHARE * rate:
            print(
                f"  {label}: the publishers offered {run.offered.rate:,.0f} events/s, under"
                f" {OFFERED_SHARE:.0%} of {rate}: a busy machine, and its lag flatters"
            )

    def held_xid(activity: HolderActivity) -> bool:
        return activity.state == "idle in transaction" and activity.backend_xid is not None

    checks = [
        (
            "(b)'s writer idle in transaction with an xid at the start and at the end",
            held_xid(at_start) and held_xid(at_end),
            f"start: {at_start}; end: {at_end}",
        ),
        *(
            (f"{label} 0 events left", run.left == 0, f"{run.left:,} left")
            for label, run in (("(a)", free), ("(b)", idle))
        ),
        *(
            (
                f"{label} p99 <= {IDLE_WRITER_P99_MS:g} ms",
                run.p99 <= IDLE_WRITER_P99_MS,
                f"p99 {run.p99:,.1f} ms",
            )
            for label, run in (("(a)", free), ("(b)", idle))
        ),
        (
            f"(b) p99 within {IDLE_WRITER_P99_RATIO:g} x (a)'s",
            ratio <= IDLE_WRITER_P99_RATIO,
            f"{ratio:.2f} x",
        ),
    ]
    failed = 0
    for name, passed, detail in checks:
        failed += not passed
        print(f"  {'PASS' if passed else 'FAIL'}  {name}" + ("" if passed else f": {detail}"))
    missed = f"FAILED ({failed} target{'s' if failed > 1 else ''})"
    print(f"  idle writer {'passed' if not failed else missed}")
    return not failed


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


# How many partitions each purge_delivered() dropped or created.
PARTITION_CHANGES: list[int] = []
# A day's events for the retention figure a day's partitions share.
EVENTS_A_DAY = 100_000


def purge_delivered() -> int:
    """Retention (outbox.services.retention.outbox_event_log_purge) of every delivered event
    as it runs once their day is over: the day partitions of the events and of their delivery
    records dropped, the cursors and ticks passed deleted, the partitions created again.
    Returns the events dropped."""
    from django.utils import timezone

    from outbox.services.partitions import DAYS_AHEAD
    from outbox.services.retention import outbox_event_log_purge

    deleted = outbox_event_log_purge(
        older_than=timezone.now() + timedelta(days=DAYS_AHEAD + 1), batch_size=1000
    )
    PARTITION_CHANGES.append(deleted["partitions"] + deleted["partitions_created"])
    return deleted["events"]


def vacuum_outbox(events: int) -> int:
    """VACUUM of the tables retention deleted from: autovacuum would do it later, and its WAL
    is part of an event's life too. Reports `events`, those the purge deleted."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM outbox_event, outbox_delivery")
    return events


def wal_per_event(count: int, batch_size: int, topics: list[str]) -> None:
    from django.db import connection

    from outbox.producer import close_producers, get_producer

    print()
    print(
        f"(c) WAL per event: {count:,} events of {PAYLOAD_BYTES} B, one per transaction, in one"
        f" session; median of {WAL_ROUNDS} rounds (min)",
        flush=True,
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
        relay = new_relay(batch_size)
        try:
            costs.setdefault("publish", []).append(
                wal_of(partial(publish_one_per_transaction, topic, count))
            )
            costs.setdefault("deliver", []).append(
                wal_of(partial(deliver_with_relay, relay, topic))
            )
        finally:
            relay.close()
        missing, duplicates = delivery_counts(topic)
        if missing or duplicates:
            print(f"  relay: {missing} events undelivered, {duplicates} sent twice")
        purged = 0

        def purge() -> int:
            nonlocal purged
            purged = purge_delivered()
            return purged

        costs.setdefault("purge", []).append(wal_of(purge))
        if purged != count:
            print(f"  retention purged {purged:,} of {count:,} events")
        costs.setdefault("vacuum", []).append(wal_of(partial(vacuum_outbox, purged)))
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

    def row(label: str, names: list[str]) -> None:
        wal = sum(median(name, "bytes_per_event") for name in names)
        lowest = sum(least(name) for name in names)
        ms = sum(median(name, "ms_per_event") for name in names)
        print(
            f"  {label:<44}{wal:>12,.0f}{lowest:>9,.0f}{wal / bare_bytes:>8.2f}"
            f"{ms:>10.3f}{ms / bare_ms:>8.2f}"
        )

    row("bare insert into bench_bare", ["bare"])
    row("(1) outbox.publish()", ["publish"])
    row("(2) relay: send, delivery record, cursors", ["deliver"])
    row("(3) retention: outbox_event_log_purge", ["purge"])
    row("(4) VACUUM after the purge", ["vacuum"])
    row("    the event's life (1 + 2 + 3 + 4)", ["publish", "deliver", "purge", "vacuum"])
    # Retention's WAL is that of the partitions it drops and creates (catalog rows), whatever
    # their events: the events of a day share it.
    purge_bytes = median("purge", "bytes_per_event") * count
    changes = statistics.median(PARTITION_CHANGES)
    life = sum(median(name, "bytes_per_event") for name in ("publish", "deliver", "vacuum"))
    per_day = purge_bytes / changes * 4 / EVENTS_A_DAY
    print(
        f"  retention wrote {purge_bytes / 1024:,.0f} KB a run for {changes:.0f} partitions"
        f" dropped or created, about {purge_bytes / changes / 1024:,.0f} KB each. A day's run"
        f" drops and creates one of each table (events, records), four: at {EVENTS_A_DAY:,} events"
        f" a day, {per_day:,.1f} B/event, and the event's life {life + per_day:,.0f} B/event,"
        f" {(life + per_day) / bare_bytes:.2f} x bare."
    )
    print(
        "  ms/event: wall time in this process per event (the relay's includes its round trips"
        " to Kafka)."
    )
    print(f"  WAL the server wrote while idle beforehand: {idle:,.0f} B/s (counted in the above)")


def rates(count: int, batch_size: int, topics: list[str]) -> None:
    print()
    print(
        f"rates: {count:,} events of {PAYLOAD_BYTES} B on {KEYS:,} keys, 6 partitions, batch"
        f" {batch_size}, in this process",
        flush=True,
    )
    topics.append(create_topic())
    producer = measure_producer(topics[-1], count)
    topics.append(create_topic())
    clear_outbox()
    plain = measure_relay(topics[-1], count, batch_size, transactional=False)
    topics.append(create_topic())
    clear_outbox()
    in_transactions = measure_relay(topics[-1], count, batch_size, transactional=True)
    clear_outbox()
    relay, transactional = plain.rate, in_transactions.rate
    print(f"  {'raw confluent-kafka producer':<42}{producer:>10,.0f} events/s")
    print(
        f"  {'relay':<42}{relay:>10,.0f} events/s"
        f"{plain.cpu_us_per_event:>8,.0f} ms CPU per 1,000 events"
    )
    print(
        f"  {'relay, transactional mode':<42}{transactional:>10,.0f} events/s"
        f"{in_transactions.cpu_us_per_event:>8,.0f} ms CPU per 1,000 events"
    )
    print(f"  {'relay / producer':<42}{relay / producer:>10.2f}")
    print(f"  {'transactional / plain relay':<42}{transactional / relay:>10.2f}")


def tracing_rates(count: int, batch_size: int, topics: list[str]) -> None:
    """The relay with tracing off and on, alternated TRACING_ROUNDS times."""

    def relay_run(sampled_one_in: int = 1) -> Measured:
        topics.append(create_topic())
        clear_outbox()
        return measure_relay(
            topics[-1],
            count,
            batch_size,
            transactional=False,
            traceparent=TRACEPARENT,
            sampled_one_in=sampled_one_in,
        )

    print()
    print(
        f"tracing: the relay on {count:,} events carrying a traceparent, best of"
        f" {TRACING_ROUNDS} alternated runs",
        flush=True,
    )
    off: list[Measured] = []
    on: list[Measured] = []
    sampled: list[Measured] = []
    exported = exported_sampled = 0
    for _ in range(TRACING_ROUNDS):
        off.append(relay_run())
        with tracing_on(queue_size=count) as spans:
            on.append(relay_run())
        exported += spans.exported
        with tracing_on(queue_size=count) as spans:
            sampled.append(relay_run(sampled_one_in=SAMPLED_ONE_IN))
        exported_sampled += spans.exported
    clear_outbox()
    print_comparison("relay", off, on)
    print_comparison(f"relay, 1 trace in {SAMPLED_ONE_IN} sampled", off, sampled, header=False)
    print(
        "  CPU: time.process_time() (every thread of this process) over the relay's drain"
        " alone, the rate's span"
    )
    print(
        f"  send spans exported in the runs with tracing on: {exported:,} for"
        f" {TRACING_ROUNDS * count:,} events; with 1 trace in {SAMPLED_ONE_IN} sampled"
        f" (the others' creation contexts flagged unsampled, as a root sampler at that ratio"
        f" leaves them): {exported_sampled:,}"
    )


SECURED_ROUNDS = 3
SECURED_RATIO_TARGET = 0.8


def secured_rates(count: int, batch_size: int, topics: list[str]) -> None:
    """The relay through the PLAINTEXT listener and through the SASL_SSL one as a user allowed
    to write each topic, alternated SECURED_ROUNDS times."""
    from confluent_kafka.admin import AdminClient, ResourceType
    from django.test.utils import override_settings

    from kafka_events.kafka import kafka_connection_config
    from outbox.producer import close_producers
    from scenarios.secured_kafka import WRITER, development_secured_kafka

    secured = development_secured_kafka(AdminClient(kafka_connection_config()))
    user = secured.user("outbox-bench-relay")

    def relay_run(*, secure: bool) -> Measured:
        topics.append(create_topic())
        clear_outbox()
        if not secure:
            return measure_relay(topics[-1], count, batch_size, transactional=False)
        secured.allow(user, ResourceType.TOPIC, topics[-1], *WRITER)
        connection = {
            "BOOTSTRAP_SERVERS": secured.bootstrap,
            "CLIENT_CONFIG": secured.client_config(user),
        }
        with override_settings(KAFKA_EVENTS=connection):
            close_producers()
            return measure_relay(topics[-1], count, batch_size, transactional=False)

    print()
    print(
        f"secured: the relay on {count:,} events of {PAYLOAD_BYTES} B, through PLAINTEXT and"
        f" through SASL_SSL ({secured.bootstrap}: TLS, SCRAM-SHA-512, ACLs), best of"
        f" {SECURED_ROUNDS} alternated runs",
        flush=True,
    )
    plain: list[Measured] = []
    secure: list[Measured] = []
    try:
        for _ in range(SECURED_ROUNDS):
            plain.append(relay_run(secure=False))
            secure.append(relay_run(secure=True))
    finally:
        secured.remove_acls()
        close_producers()
    clear_outbox()
    best_plain, best_secure = max(m.rate for m in plain), max(m.rate for m in secure)
    cpu_plain = min(m.cpu_us_per_event for m in plain)
    cpu_secure = min(m.cpu_us_per_event for m in secure)
    ratio = best_secure / best_plain
    verdict = "PASS" if ratio >= SECURED_RATIO_TARGET else "FAIL"
    print(f"  {'':<42}{'events/s':>10}{'CPU µs/event':>14}")
    print(f"  {'relay, PLAINTEXT':<42}{best_plain:>10,.0f}{cpu_plain:>14,.0f}")
    print(f"  {'relay, SASL_SSL':<42}{best_secure:>10,.0f}{cpu_secure:>14,.0f}")
    print(
        f"  {'SASL_SSL / PLAINTEXT':<42}{ratio:>10.2f}{cpu_secure / cpu_plain:>14.2f}"
        f"  target >= {SECURED_RATIO_TARGET}: {verdict}"
    )
    for name, figure in (("events/s", "rate"), ("CPU µs/event", "cpu_us_per_event")):
        runs = [", ".join(f"{getattr(m, figure):,.0f}" for m in mode) for mode in (plain, secure)]
        print(f"  every run, {name}: PLAINTEXT {runs[0]}; SASL_SSL {runs[1]}")
    print(
        "  CPU: time.process_time() of this process over the drain; TLS work of librdkafka's"
        " threads included"
    )


def publish_lag(rate: int, seconds: float, environment: dict[str, str], topics: list[str]) -> None:
    """Publish lag with `outbox_relay`, then with Celery beat (1 s) and the on-commit nudge."""
    from django.conf import settings
    from django.test import override_settings

    python = sys.executable
    print()
    print(
        f"publish lag at {rate} events/s on {KEYS:,} keys offered for {seconds:.0f} s:",
        flush=True,
    )
    clear_outbox()
    topics.append(create_topic())
    relay = start([python, "manage.py", "outbox_relay", "--poll-seconds", "1"], environment)
    try:
        time.sleep(3)
        warm_up(topics[-1])
        offered = offer_load(topics[-1], rate, seconds)
        p50, p99, worst, missing = lag_percentiles(topics[-1])
    finally:
        stop(relay)
    report_lag("outbox_relay (LISTEN/NOTIFY)", offered, p50, p99, worst, missing)

    clear_outbox()
    topics.append(create_topic())
    beat_environment = {
        **environment,
        "OUTBOX_NUDGE_ON_COMMIT": "true",
        "OUTBOX_RELAY_INTERVAL": "1",
    }
    worker = start(
        [python, "-m", "celery", "-A", "project", "worker", "--concurrency", "2", "-Q", "celery"],
        beat_environment,
    )
    beat_schedule = str(BASE_DIR / ".local" / "outbox-bench-beat")
    beat = start(
        [python, "-m", "celery", "-A", "project", "beat", "-s", beat_schedule], beat_environment
    )
    try:
        time.sleep(8)
        with override_settings(OUTBOX={**settings.OUTBOX, "NUDGE_ON_COMMIT": True}):
            warm_up(topics[-1])
            offered = offer_load(topics[-1], rate, seconds)
        p50, p99, worst, missing = lag_percentiles(topics[-1])
    finally:
        stop(beat)
        stop(worker)
    report_lag("Celery beat (1 s) + nudge", offered, p50, p99, worst, missing)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", choices=PARTS, action="append", help="run only these parts (repeatable)"
    )
    parser.add_argument(
        "--events", type=int, default=50_000, help="events per rate (rates, secured)"
    )
    parser.add_argument(
        "--relays-events", type=int, default=200_000, help="backlog's events (relays)"
    )
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--lag-rate", type=int, default=1000, help="offered load, events/s (lag, one-key)"
    )
    parser.add_argument(
        "--lag-seconds", type=float, default=10.0, help="offered load's length (lag)"
    )
    parser.add_argument(
        "--skew-events", type=int, default=100_000, help="events per key count (skew)"
    )
    parser.add_argument(
        "--snapshot-rate", type=int, default=800, help="offered load, events/s (snapshot)"
    )
    parser.add_argument(
        "--snapshot-seconds", type=float, default=180.0, help="offered load's length (snapshot)"
    )
    parser.add_argument("--wal-events", type=int, default=2000, help="events per round (wal)")
    parser.add_argument(
        "--one-key-seconds", type=float, default=30.0, help="offered load's length (one-key)"
    )
    parser.add_argument(
        "--idle-writer-seconds",
        type=float,
        default=600.0,
        help="offered load's length (idle-writer)",
    )
    parser.add_argument("--keep-database", action="store_true", help="reuse its database")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="rates: also the relay with tracing off and on, their CPU and the ratios",
    )
    options = parser.parse_args()

    url = sibling_database_url(BENCH_DATABASE_SUFFIX)
    if not options.keep_database:
        recreate_database(url)
    os.environ["DATABASE_URL"] = url
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from kafka_events.conf import kafka_settings

    call_command("migrate", verbosity=0)
    environment = {**os.environ, "DATABASE_URL": url}
    parts = [part for part in PARTS if part in (options.only or PARTS)]
    database = settings.DATABASES["default"]["NAME"]
    print(
        f"outbox benchmark ({', '.join(parts)}): database {database}, Kafka"
        f" {kafka_settings.BOOTSTRAP_SERVERS}"
    )
    topics: list[str] = []
    missed = False
    try:
        if "rates" in parts:
            rates(options.events, options.batch_size, topics)
            if options.tracing:
                tracing_rates(options.events, options.batch_size, topics)
        if "secured" in parts:
            secured_rates(options.events, options.batch_size, topics)
        if "relays" in parts:
            relay_processes(options.relays_events, environment, topics)
        if "lag" in parts:
            publish_lag(options.lag_rate, options.lag_seconds, environment, topics)
        if "skew" in parts:
            key_skew(options.skew_events, options.batch_size, topics)
        if "snapshot" in parts:
            held_snapshot(options.snapshot_rate, options.snapshot_seconds, url, environment, topics)
        if "wal" in parts:
            wal_per_event(options.wal_events, options.batch_size, topics)
        if "one-key" in parts:
            one_key_lag(options.lag_rate, options.one_key_seconds, url, environment, topics)
        if "idle-writer" in parts:
            missed = not idle_writer(options.idle_writer_seconds, url, environment, topics)
    finally:
        delete_topics(topics)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
