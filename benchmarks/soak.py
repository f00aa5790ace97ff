"""Soak test: the whole pipeline under a steady load for a long time, one row a minute.

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--rate 1000] [--consumers 1]

Not part of CI (`make soak`, SOAK_ARGS="--minutes 3"). For --minutes it runs, against the real
PostgreSQL and Kafka of `make services-up`, in a database of its own (`<DATABASE name>_soak`,
recreated each run) and a topic of its own (deleted at the end):
- writer processes (benchmarks.outbox_bench's publishers) offering --rate events/s of an
  order (0.45 to 0.9 KB of JSON) on --keys keys through outbox.publish(), one event per transaction;
- one `manage.py outbox_relay` and --consumers `manage.py inbox_consume` processes, whose
  handler is the scenario handler (scenarios/handlers.py: one row in scenario_effect per run,
  so the effects outlive inbox retention and a handler run twice shows);
- retention every minute with a retention of --retention-minutes: the outbox's
  (outbox_event_log_purge) and the inbox's (inbox_messages_purge_processed). Retention drops
  day partitions; so that it drops some during the run, this database's event and delivery
  tables are partitioned by minute instead of by day (see minute_partitions_create_ahead);
- the console polled every --console-seconds by Django's test client in a process of its
  own: the dashboard, the admin's event list, the admin page of a recent event and the API's
  event list.
Each minute (5 s after its end, for what was in flight to commit) one row: events offered
(committed by the writers), published (delivery records) and consumed (inbox rows processed)
in the minute; p99 publish lag (created -> delivery record) of the events published in it;
p99 consume lag (created -> processed in the inbox) of the events processed in it; the size
of the event, inbox and delivery tables; their dead tuples; the console's p95; what retention
removed. Then the writers stop, the rest drains for at most --drain-seconds, and a summary
checks the bounds printed with it; the exit code is 1 when one is missed.
"""

import argparse
import gc
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")
# The console's pages are fetched by Django's test client, whose host is "testserver".
os.environ["ALLOWED_HOSTS"] = "testserver,localhost"
# The rows are the output: no INFO lines of this process (a console login) or of the relay's
# and consumers' (their logs, under LOG_DIR).
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

from benchmarks import outbox_bench as bench  # noqa: E402  (also: no nudge, DEBUG off)
from benchmarks.databases import recreate_database, sibling_database_url  # noqa: E402

if TYPE_CHECKING:
    from multiprocessing.context import ForkProcess
    from multiprocessing.synchronize import Event

SOAK_DATABASE_SUFFIX = "_soak"
MINUTE_SECONDS = 60.0
# A minute's row waits this long after the minute for the records in flight at its end.
REPORT_DELAY_SECONDS = 5.0
# The publish lag query reads the events created at most this long before the minute; an
# event published in the minute but created earlier counts with this lag (a lower bound).
PUBLISH_LOOKBACK = timedelta(minutes=1)
# Minute partitions kept ahead of now; retention (every minute) creates them.
MINUTES_AHEAD = 3
# A delivery record lives this much longer than the partition of its event (a day in
# production, outbox.services.retention.DELIVERY_GRACE).
SOAK_DELIVERY_GRACE = timedelta(minutes=1)
WARM_UP_EVENTS = 20
# One event per transaction: each writer waits for its commit's WAL flush before the next, so
# 1,000 events/s takes more writers than the outbox benchmark's 10 events per transaction.
WRITER_PROCESSES = 8
# A minute in which the writers offered less than this share of --rate fails the run: its
# figures would not be those of the load asked for.
OFFERED_SHARE = 0.95
TABLES = ("outbox_event", "inbox_message", "outbox_delivery")
LOG_DIR = BASE_DIR / ".local" / "soak"


def order_payload(number: int) -> dict[str, Any]:
    """An order as a shop would publish it: 1 to 5 lines, a customer, an address; 0.45 to
    0.9 KB of JSON. "seq" is what the scenario handler records."""
    lines = 1 + number % 5
    return {
        "order_id": f"ord-{number:012d}",
        "number": number,
        "seq": number,
        "customer": {
            "id": f"cus-{number % 50_000:06d}",
            "email": f"customer{number % 50_000}@example.com",
            "tier": ("standard", "silver", "gold")[number % 3],
        },
        "currency": "EUR",
        "lines": [
            {
                "sku": f"SKU-{(number * 7 + line) % 9973:05d}",
                "name": f"Article {(number * 7 + line) % 9973} in a box of {1 + line % 4}",
                "quantity": 1 + (number + line) % 3,
                "unit_price": f"{5 + (number + line) % 95}.{(number * line) % 100:02d}",
            }
            for line in range(lines)
        ],
        "shipping_address": {
            "name": f"Customer {number % 50_000}",
            "street": f"{1 + number % 200} Long Street",
            "city": ("Berlin", "Lyon", "Porto", "Ghent")[number % 4],
            "postcode": f"{10000 + number % 89999}",
            "country": ("DE", "FR", "PT", "BE")[number % 4],
        },
        "placed_at": datetime.now(UTC).isoformat(),
        "note": "Leave the parcel at the door." if number % 7 == 0 else "",
    }


# Minute partitions ------------------------------------------------------------------------


def minute_floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def minute_partition_create(*, table: str, start: datetime) -> str:
    """The minute [start, start + 1 min) of `table` as a partition, made as retention makes a
    day's."""
    from outbox.services.partitions import partition_range_create

    return partition_range_create(
        table=table,
        name=f"{table}_p{start:%Y%m%d%H%M}",
        lower=start,
        upper=start + timedelta(minutes=1),
    )


def minute_partitions_create_ahead(*, table: str) -> list[str]:
    """In place of retention's partitions_create_ahead (days): the partitions of the minutes
    from the last one to MINUTES_AHEAD ahead that none covers. A lock that does not come in
    time leaves the minute for the next run, as retention leaves a day."""
    from outbox.services.partitions import PartitionLocked, partitions_read

    existing = [p for p in partitions_read(table=table) if not p.is_default]
    now = minute_floor(datetime.now(UTC))
    created = []
    for offset in range(-1, MINUTES_AHEAD + 1):
        start = now + timedelta(minutes=offset)
        end = start + timedelta(minutes=1)
        if any(
            (p.lower is None or p.lower <= start) and p.upper is not None and p.upper >= end
            for p in existing
        ):
            continue
        try:
            created.append(minute_partition_create(table=table, start=start))
        except PartitionLocked as error:
            print(f"  retention could not create the minute {start:%H:%M} of {table}: {error}")
    return created


def partition_by_minute() -> None:
    """Replaces the day partitions the migrations made (the database is new: they are
    empty) with minute partitions around now; the DEFAULT partitions stay."""
    from django.db import connection
    from psycopg import sql

    from outbox.services.partitions import partitions_read

    for table in ("outbox_event", "outbox_delivery"):
        for partition in partitions_read(table=table):
            if not partition.is_default:
                with connection.cursor() as cursor:
                    cursor.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(partition.name)))
        minute_partitions_create_ahead(table=table)


# Retention --------------------------------------------------------------------------------


@dataclass
class RetentionRun:
    at: float  # time.time()
    events: int = 0
    deliveries: int = 0
    partitions: int = 0
    partitions_created: int = 0
    inbox: int = 0
    error: str = ""


def _retention_loop(
    retention: timedelta,
    first_at: float,
    runs: "multiprocessing.Queue[RetentionRun]",
    stop: "Event",
) -> None:
    """Retention every minute from `first_at` (time.time()) until `stop`: the outbox's and
    the inbox's, as beat's tasks run them but with `retention` for their days, on minute
    partitions (this process only: the two names retention reads are swapped here)."""
    from django.db import connection
    from django.utils import timezone

    import outbox.services.retention as outbox_retention
    from inbox.services.retention import inbox_messages_purge_processed
    from outbox.conf import outbox_settings

    outbox_retention.partitions_create_ahead = minute_partitions_create_ahead  # type: ignore[assignment]
    outbox_retention.DELIVERY_GRACE = SOAK_DELIVERY_GRACE
    next_at = first_at
    try:
        while not stop.wait(max(0.0, next_at - time.time())):
            next_at += MINUTE_SECONDS
            run = RetentionRun(at=time.time())
            try:
                older_than = timezone.now() - retention
                removed = outbox_retention.outbox_event_log_purge(
                    older_than=older_than, batch_size=outbox_settings.RETENTION_BATCH_SIZE
                )
                run.events, run.deliveries = removed["events"], removed["deliveries"]
                run.partitions = removed["partitions"]
                run.partitions_created = removed["partitions_created"]
                run.inbox = inbox_messages_purge_processed(older_than=older_than)
            except Exception as error:  # reported, and tried again in a minute
                run.error = f"{type(error).__name__}: {error}"
                connection.close()
            runs.put(run)
    finally:
        connection.close()


# The console --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsoleSample:
    at: float  # time.time()
    page: str
    ms: float
    status: int  # 0: the client raised


def _console_loop(
    interval: float, user_id: int, samples: "multiprocessing.Queue[ConsoleSample]", stop: "Event"
) -> None:
    """Every `interval` seconds, as an operator with the console open: the dashboard, the
    admin's event list, a recent event's admin page (its timeline) and the API's list."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from outbox.models import OutboxEvent

    # The test client serves no static files: WhiteNoise's warning that it has none says nothing.
    warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)
    client = Client(raise_request_exception=False)
    client.force_login(get_user_model().objects.get(pk=user_id))
    try:
        while not stop.is_set():
            started = time.monotonic()
            recent = (
                OutboxEvent.objects.filter(created_at__gte=timezone.now() - timedelta(seconds=30))
                .values_list("id", flat=True)
                .first()
            )
            pages = [
                ("dashboard", "/admin/"),
                ("event list", "/admin/outbox/outboxevent/"),
                ("API events", "/api/outbox/events/"),
            ]
            if recent is not None:
                pages.append(("event detail", f"/admin/outbox/outboxevent/{recent}/change/"))
            for page, url in pages:
                began = time.perf_counter()
                try:
                    status = client.get(url).status_code
                except Exception:  # counted as an error; the poller goes on
                    status = 0
                samples.put(
                    ConsoleSample(time.time(), page, 1000 * (time.perf_counter() - began), status)
                )
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
    finally:
        connection.close()


# Measuring ----------------------------------------------------------------------------------


def percentile(values: list[float], percent: int) -> float:
    if not values:
        return math.nan
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def ms(value: float) -> str:
    """Milliseconds as the rows print them; "-" for a minute without any."""
    return "-" if math.isnan(value) else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def worst(values: Iterable[float]) -> float:
    """The highest, NaN (a minute without events) counting as the highest."""
    listed = list(values)
    return math.nan if not listed or any(math.isnan(v) for v in listed) else max(listed)


def query_one(sql: str, params: list[Any] | dict[str, Any]) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def published_events(start: datetime, end: datetime) -> int:
    """Events with a PUBLISHED delivery record in [start, end)."""
    return int(
        query_one(
            "SELECT count(DISTINCT event_id) FROM outbox_delivery WHERE outcome = 'PUBLISHED'"
            " AND published_at >= %s AND published_at < %s",
            [start, end],
        )
    )


def consume_lags(group: str, start: datetime, end: datetime) -> list[float]:
    """Milliseconds from each event's creation (the relay's created_at header) to its
    processing in the inbox, of the group's messages processed in [start, end)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT EXTRACT(EPOCH FROM processed_at - (headers->>'created_at')::timestamptz) * 1000
            FROM inbox_message
            WHERE consumer_group = %s AND status = 'DONE'
              AND processed_at >= %s AND processed_at < %s
            """,
            [group, start, end],
        )
        return [float(lag) for (lag,) in cursor.fetchall()]


def table_bytes(table: str) -> int:
    """Bytes of `table` (partitioned or not) with its partitions, indexes and TOAST."""
    return int(
        query_one(
            "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM"
            " (SELECT relid FROM pg_partition_tree(%(table)s::regclass)"
            " UNION SELECT %(table)s::regclass) AS tree",
            {"table": table},
        )
    )


def effects(run: str) -> tuple[int, int]:
    """(events whose handler ran, handler runs) of the run."""
    from django.db.models import Count

    from scenarios.models import ScenarioEffect

    counts = ScenarioEffect.objects.filter(run=run).aggregate(
        events=Count("event_id", distinct=True), runs=Count("id")
    )
    return counts["events"], counts["runs"]


@dataclass
class MinuteRow:
    minute: int
    offered: int
    published: int
    consumed: int
    publish_p99: float
    consume_p99: float
    sizes: dict[str, int]
    dead: dict[str, int]
    console_p95: float
    console_errors: int
    retention: list[RetentionRun] = field(default_factory=list)

    HEADER = (
        f"{'min':>3}{'offered':>9}{'publ.':>8}{'cons.':>8}{'pub p99':>9}{'con p99':>9}"
        f"{'event MB':>9}{'inbox MB':>9}{'deliv MB':>9}{'dead ev':>8}{'dead in':>8}"
        f"{'dead dl':>8}{'console':>9}  retention: events/partitions dropped, inbox deleted"
    )

    def line(self) -> str:
        def megabytes(table: str) -> str:
            return f"{self.sizes[table] / 1024**2:,.1f}"

        dropped = sum(run.events for run in self.retention)
        partitions = sum(run.partitions for run in self.retention)
        inbox = sum(run.inbox for run in self.retention)
        retention = f"{dropped:,}/{partitions}, {inbox:,}" if self.retention else "-"
        if any(run.error for run in self.retention):
            retention += " ERROR"
        console = ms(self.console_p95) + (
            f" ({self.console_errors} errors)" if self.console_errors else ""
        )
        return (
            f"{self.minute:>3}{self.offered:>9,}{self.published:>8,}{self.consumed:>8,}"
            f"{ms(self.publish_p99):>9}{ms(self.consume_p99):>9}"
            f"{megabytes('outbox_event'):>9}{megabytes('inbox_message'):>9}"
            f"{megabytes('outbox_delivery'):>9}{self.dead['outbox_event']:>8,}"
            f"{self.dead['inbox_message']:>8,}{self.dead['outbox_delivery']:>8,}"
            f"{console:>9}  {retention}"
        )


def drain_queue(queue: "multiprocessing.Queue[Any]") -> list[Any]:
    items = []
    while True:
        try:
            items.append(queue.get_nowait())
        except Exception:  # queue.Empty; the queue module's name is shadowed by the argument
            return items


# The run --------------------------------------------------------------------------------------


@dataclass
class Bounds:
    publish_p99_ms: float
    consume_p99_ms: float


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=int, default=30, help="minutes of load (default 30)")
    parser.add_argument("--rate", type=int, default=1000, help="events/s offered (default 1000)")
    parser.add_argument("--keys", type=int, default=10_000, help="aggregates (Kafka keys)")
    parser.add_argument(
        "--writers",
        type=int,
        default=WRITER_PROCESSES,
        help=f"processes offering the rate (default {WRITER_PROCESSES})",
    )
    parser.add_argument("--consumers", type=int, default=1, help="inbox_consume processes")
    parser.add_argument("--partitions", type=int, default=6, help="of the soak's topic")
    parser.add_argument(
        "--retention-minutes", type=int, default=2, help="retention of the outbox and inbox"
    )
    parser.add_argument("--console-seconds", type=float, default=5.0, help="console poll interval")
    parser.add_argument(
        "--drain-seconds", type=float, default=120.0, help="after the load, at most"
    )
    parser.add_argument("--max-publish-p99-ms", type=float, default=1000.0)
    parser.add_argument("--max-consume-p99-ms", type=float, default=5000.0)
    options = parser.parse_args()
    if options.retention_minutes < 2:
        # A minute's inbox rows are read 5 s after it: retention must not have taken them.
        parser.error("--retention-minutes must be at least 2")
    bounds = Bounds(options.max_publish_p99_ms, options.max_consume_p99_ms)

    url = sibling_database_url(SOAK_DATABASE_SUFFIX)
    recreate_database(url)
    os.environ["DATABASE_URL"] = url
    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connections, transaction

    import outbox
    from inbox.models import InboxMessage
    from scenarios.conf import EVENT_TYPE, GROUP_VARIABLE, RUN_VARIABLE, TOPIC_VARIABLE

    call_command("migrate", verbosity=0)
    partition_by_minute()
    run_id = f"{datetime.now(UTC):%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}"
    group = f"soak-{run_id}"
    log_dir = LOG_DIR / run_id
    user, _ = get_user_model().objects.get_or_create(
        username="soak", defaults={"is_staff": True, "is_superuser": True}
    )
    topic = bench.create_topic(options.partitions)
    environment = {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
        TOPIC_VARIABLE: topic,
        GROUP_VARIABLE: group,
        RUN_VARIABLE: run_id,
    }
    sizes = [len(json.dumps(order_payload(n))) for n in range(1000)]
    print(
        f"soak: {options.minutes} min at {options.rate:,} events/s (one per transaction, orders"
        f" of {min(sizes)}-{max(sizes)} B, mean {statistics.mean(sizes):.0f} B) on"
        f" {options.keys:,} keys from {options.writers} writers; topic {topic}"
        f" ({options.partitions} partitions); 1 relay,"
        f" {options.consumers} consumer(s); retention of {options.retention_minutes} min every"
        f" minute on minute partitions; console every {options.console_seconds:g} s;"
        f" database {settings.DATABASES['default']['NAME']}; logs {log_dir}",
        flush=True,
    )
    print(
        f"bounds: the writers offer >= {OFFERED_SHARE:.0%} of the rate in each minute;"
        f" every event offered published and consumed by the end of a drain of at most"
        f" {options.drain_seconds:.0f} s; each minute p99 publish lag <= {bounds.publish_p99_ms:g}"
        f" ms and p99 consume lag <= {bounds.consume_p99_ms:g} ms; dead tuples of outbox_event 0"
        " in each minute; the console answers every request; every process runs to the end",
        flush=True,
    )
    processes: dict[str, subprocess.Popen[bytes]] = {}
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    children: list[multiprocessing.process.BaseProcess] = []
    writers: list[ForkProcess] = []
    problems: list[str] = []
    try:
        processes["relay"] = bench.start(
            [sys.executable, "manage.py", "outbox_relay", "--poll-seconds", "1", "--slot", group],
            environment,
            log_dir / "relay.log",
        )
        for index in range(options.consumers):
            processes[f"consumer-{index + 1}"] = bench.start(
                [sys.executable, "manage.py", "inbox_consume", "--group", group],
                environment,
                log_dir / f"consumer-{index + 1}.log",
            )

        # A few events through the relay and the consumers before the clock starts: the
        # producer knows the topic's leaders, the consumers have joined the group.
        for number in range(WARM_UP_EVENTS):
            with transaction.atomic():
                outbox.publish(
                    aggregate_type="order",
                    aggregate_id=f"order-{number}",
                    event_type=EVENT_TYPE,
                    payload=order_payload(-1 - number),
                    topic=topic,
                )
        deadline = time.monotonic() + 60
        processed = InboxMessage.objects.filter(consumer_group=group, status="DONE")
        while processed.count() < WARM_UP_EVENTS and time.monotonic() < deadline:
            time.sleep(0.5)
        warmed = processed.count()
        print(f"warm-up: {warmed} of {WARM_UP_EVENTS} events consumed", flush=True)

        # Forked before this process has a thread or a Kafka client of its own.
        connections.close_all()
        gc.collect()
        started_at = time.time()
        retention_runs: multiprocessing.Queue[RetentionRun] = context.Queue()
        console_samples: multiprocessing.Queue[ConsoleSample] = context.Queue()
        children = [
            context.Process(
                target=_retention_loop,
                args=(
                    timedelta(minutes=options.retention_minutes),
                    started_at + MINUTE_SECONDS / 2,
                    retention_runs,
                    stop,
                ),
                name="retention",
            ),
            context.Process(
                target=_console_loop,
                args=(options.console_seconds, user.pk, console_samples, stop),
                name="console",
            ),
        ]
        for child in children:
            child.start()
        committed = context.Value("q", 0)
        load = bench.Load(
            processes=options.writers,
            per_transaction=1,
            aggregate_type="order",
            payload=order_payload,
            committed=committed,
        )
        writers, _costs = bench.start_publishers(
            topic, options.rate, options.minutes * MINUTE_SECONDS, EVENT_TYPE, options.keys, load
        )

        rows: list[MinuteRow] = []
        samples: list[ConsoleSample] = []
        runs: list[RetentionRun] = []
        offered_before = 0
        print(MinuteRow.HEADER, flush=True)
        for minute in range(options.minutes):
            window_end = started_at + (minute + 1) * MINUTE_SECONDS
            time.sleep(max(0.0, window_end - time.time()))
            with committed.get_lock():
                offered_now = committed.value
            time.sleep(REPORT_DELAY_SECONDS)
            start = datetime.fromtimestamp(window_end - MINUTE_SECONDS, UTC)
            end = datetime.fromtimestamp(window_end, UTC)
            published = published_events(start, end)
            lags = bench.publish_lags(
                topic,
                EVENT_TYPE,
                created_from=start - PUBLISH_LOOKBACK,
                published_from=start,
                published_before=end,
            )
            lags += [PUBLISH_LOOKBACK.total_seconds() * 1000] * max(0, published - len(lags))
            consumed = consume_lags(group, start, end)
            samples += drain_queue(console_samples)
            runs += drain_queue(retention_runs)
            in_minute = [
                sample
                for sample in samples
                if window_end - MINUTE_SECONDS <= sample.at < window_end
            ]
            row = MinuteRow(
                minute=minute + 1,
                offered=offered_now - offered_before,
                published=published,
                consumed=len(consumed),
                publish_p99=percentile(lags, 99),
                consume_p99=percentile(consumed, 99),
                sizes={table: table_bytes(table) for table in TABLES},
                dead={table: bench.dead_tuples(table) for table in TABLES},
                console_p95=percentile([sample.ms for sample in in_minute], 95),
                console_errors=sum(1 for sample in in_minute if sample.status != 200),
                retention=[
                    run for run in runs if window_end - MINUTE_SECONDS <= run.at < window_end
                ],
            )
            offered_before = offered_now
            rows.append(row)
            print(row.line(), flush=True)

        for writer in writers:
            writer.join(60)
        problems += [
            f"writer {writer.pid} ended with exit code {writer.exitcode}"
            for writer in writers
            if writer.exitcode != 0
        ]
        with committed.get_lock():
            offered = committed.value + WARM_UP_EVENTS

        drain_started = time.monotonic()
        while True:
            unpublished = bench.undelivered(topic)
            consumed_events, handler_runs = effects(run_id)
            drained = unpublished == 0 and consumed_events >= offered
            if drained or time.monotonic() - drain_started > options.drain_seconds:
                break
            time.sleep(2)
        drain_seconds = time.monotonic() - drain_started
        for name, process in processes.items():
            if process.poll() is not None:
                problems.append(f"{name} ended early with exit code {process.returncode}")
        stop.set()
        for child in children:
            child.join(60)
            if child.exitcode != 0:
                problems.append(f"the {child.name} process ended with exit code {child.exitcode}")
        samples += drain_queue(console_samples)
        runs += drain_queue(retention_runs)
    finally:
        stop.set()
        for process in processes.values():
            bench.stop(process)
        for child in [*children, *writers]:
            if child.is_alive():
                child.terminate()
        connections.close_all()
        bench.delete_topics([topic])

    return report(
        options=options,
        bounds=bounds,
        rows=rows,
        samples=samples,
        runs=runs,
        offered=offered,
        unpublished=unpublished,
        consumed_events=consumed_events,
        handler_runs=handler_runs,
        drain_seconds=drain_seconds,
        drained=drained,
        problems=problems,
    )


def report(
    *,
    options: argparse.Namespace,
    bounds: Bounds,
    rows: list[MinuteRow],
    samples: list[ConsoleSample],
    runs: list[RetentionRun],
    offered: int,
    unpublished: int,
    consumed_events: int,
    handler_runs: int,
    drain_seconds: float,
    drained: bool,
    problems: list[str],
) -> int:
    """Prints the summary and the checks; returns the exit code."""
    console_ms = [sample.ms for sample in samples]
    console_errors = [sample for sample in samples if sample.status != 200]
    print()
    print(
        f"summary: {offered:,} events offered ({WARM_UP_EVENTS} of them the warm-up), "
        f"{offered - unpublished:,} published, {consumed_events:,} consumed"
        f" ({handler_runs:,} handler runs); "
        + (
            f"drained {drain_seconds:.0f} s after the load"
            if drained
            else f"NOT drained {drain_seconds:.0f} s after the load"
        )
    )
    print(
        f"  p99 per minute, the worst: publish lag {ms(worst(r.publish_p99 for r in rows))} ms,"
        f" consume lag {ms(worst(r.consume_p99 for r in rows))} ms"
    )
    print(
        f"  console: {len(samples):,} requests, p95 {percentile(console_ms, 95):,.1f} ms,"
        f" max {max(console_ms, default=math.nan):,.1f} ms, {len(console_errors)} not answered 200"
    )
    print(
        f"  retention: {len(runs)} runs, {sum(r.events for r in runs):,} events and"
        f" {sum(r.deliveries for r in runs):,} delivery records dropped with"
        f" {sum(r.partitions for r in runs)} partitions, {sum(r.partitions_created for r in runs)}"
        f" partitions created, {sum(r.inbox for r in runs):,} inbox rows deleted,"
        f" {sum(1 for r in runs if r.error)} runs failed"
    )
    for run in runs:
        if run.error:
            print(f"    retention at {datetime.fromtimestamp(run.at, UTC):%H:%M:%S}: {run.error}")
    for page in sorted({sample.page for sample in samples}):
        of_page = [sample.ms for sample in samples if sample.page == page]
        print(
            f"    console {page:<13} p95 {percentile(of_page, 95):8,.1f} ms"
            f" ({len(of_page)} requests)"
        )

    def every_minute(value: Any) -> bool:
        return bool(rows) and all(value(row) for row in rows)

    offered_floor = OFFERED_SHARE * options.rate * MINUTE_SECONDS
    checks = [
        (
            f"the writers offered >= {OFFERED_SHARE:.0%} of {options.rate:,} events/s in every"
            " minute",
            every_minute(lambda row: row.offered >= offered_floor),
            "minutes under: "
            + ", ".join(
                f"{row.minute} ({row.offered / MINUTE_SECONDS:,.0f}/s)"
                for row in rows
                if row.offered < offered_floor
            ),
        ),
        (
            "0 events lost: all offered published and consumed",
            unpublished == 0 and consumed_events == offered,
            f"{unpublished:,} not published, {offered - consumed_events:,} not consumed",
        ),
        (
            "no handler ran twice for an event",
            handler_runs == consumed_events,
            f"{handler_runs - consumed_events:,} extra runs",
        ),
        (
            f"p99 publish lag <= {bounds.publish_p99_ms:g} ms in every minute",
            every_minute(lambda row: row.publish_p99 <= bounds.publish_p99_ms),
            "minutes over (or without events): "
            + ", ".join(
                str(row.minute) for row in rows if not row.publish_p99 <= bounds.publish_p99_ms
            ),
        ),
        (
            f"p99 consume lag <= {bounds.consume_p99_ms:g} ms in every minute",
            every_minute(lambda row: row.consume_p99 <= bounds.consume_p99_ms),
            "minutes over (or without events): "
            + ", ".join(
                str(row.minute) for row in rows if not row.consume_p99 <= bounds.consume_p99_ms
            ),
        ),
        (
            "dead tuples of outbox_event 0 in every minute",
            every_minute(lambda row: row.dead["outbox_event"] == 0),
            "worst " + str(max((row.dead["outbox_event"] for row in rows), default=0)),
        ),
        (
            "the console answered every request with 200",
            bool(samples) and not console_errors,
            f"{len(console_errors)} of {len(samples)}: "
            + ", ".join(sorted({f"{s.page} {s.status}" for s in console_errors})),
        ),
        ("every process ran to the end", not problems, "; ".join(problems)),
    ]
    print()
    failed = 0
    for name, passed, detail in checks:
        failed += not passed
        print(f"  {'PASS' if passed else 'FAIL'}  {name}" + ("" if passed else f": {detail}"))
    print(f"soak {'passed' if not failed else f'FAILED ({failed} checks)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
