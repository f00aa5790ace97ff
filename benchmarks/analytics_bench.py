"""Analytics benchmark: generates N events (outbox rows, and inbox rows for 1.5 consumer groups
per event with 1% duplicates) with PostgreSQL's generate_series, runs the analytics job on
them, and prints its wall time (Spark's start included), rows per second and peak memory next
to the same lag percentiles computed by one PostgreSQL query.

    .venv/bin/python benchmarks/analytics_bench.py [--events 1000000] [--reuse]

It works in a database of its own, `<dev database>_analytics_bench` (created and migrated if
missing), never the development database: it empties the outbox and inbox tables of that
database before generating. --reuse keeps the data if it already has --events events.
"""

import argparse
import os
import resource
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from benchmarks.databases import database_name, ensure_database, sibling_database_url  # noqa: E402

if TYPE_CHECKING:
    from analytics.models import AnalyticsRun

BENCH_SUFFIX = "_analytics_bench"

# Fixed and long past: every SLA has passed, and a second run reuses the same data.
BENCH_START = datetime(2025, 1, 1, tzinfo=UTC)
BENCH_HOURS = 24
TOPICS = 4
EVENT_TYPES = 8
# Every topic is read by group-a; even topics by group-b too: 1.5 inbox rows per event.
GROUPS = ("group-a", "group-b")

# The events as publish() writes them, and what the relay writes of them: every 2,000th
# event unsent (after the relay's cursors), the next one FAILED (ten failed tries, held with
# its attempts spent), the others PUBLISHED, every 50th after two failed tries.
EVENTS_SQL = """
INSERT INTO outbox_event (
    id, aggregatetype, aggregateid, type, payload, headers, topic, key, created_at
)
SELECT
    md5('bench-' || g)::uuid, 'order', 'agg-' || mod(g, 10000), 'type.' || mod(g, %(types)s),
    '{}'::jsonb, '{}'::jsonb, 'bench.topic.' || mod(mod(g, %(types)s), %(topics)s),
    'agg-' || mod(g, 10000), created
FROM (
    SELECT g, %(start)s::timestamptz
        + make_interval(secs => (g::float8 / %(events)s) * %(seconds)s) AS created
    FROM generate_series(0, %(events)s - 1) AS g
) AS s
"""

DELIVERIES_SQL = """
INSERT INTO outbox_delivery (
    event_id, outcome, published_at, kafka_partition, kafka_offset, error, relay
)
SELECT md5('bench-' || g)::uuid, outcome, at, partition, "offset", error, 'bench'
FROM (
    SELECT g, created, try, try_count,
        CASE WHEN mod(g, 2000) > 1 AND try = try_count THEN 'PUBLISHED' ELSE 'FAILED' END
            AS outcome,
        CASE WHEN mod(g, 2000) > 1 AND try = try_count
            -- log-normal publish lag: median 50 ms, long tail
            THEN created + make_interval(secs => exp(ln(0.05)
                + 0.9 * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())))
            ELSE created + make_interval(secs => try)
        END AS at,
        CASE WHEN mod(g, 2000) > 1 AND try = try_count THEN mod(g, 6) END AS partition,
        CASE WHEN mod(g, 2000) > 1 AND try = try_count THEN g / 6 END AS "offset",
        CASE WHEN mod(g, 2000) > 1 AND try = try_count THEN ''
            ELSE 'MSG_TIMED_OUT: Local: Message timed out' END AS error
    FROM (
        SELECT g, %(start)s::timestamptz
            + make_interval(secs => (g::float8 / %(events)s) * %(seconds)s) AS created,
            CASE WHEN mod(g, 2000) = 0 THEN 0 WHEN mod(g, 2000) = 1 THEN 10
                WHEN mod(g, 50) = 0 THEN 3 ELSE 1 END AS try_count
        FROM generate_series(0, %(events)s - 1) AS g
    ) AS events
    CROSS JOIN LATERAL generate_series(1, try_count) AS try
    -- in the order the relay writes them: an event's tries one after the other
    ORDER BY g, try
) AS tries
"""

HELD_SQL = """
INSERT INTO outbox_held_event (
    event_id, shard, topic, key, transaction_id, position, event_transaction_id, event_position,
    event_created_at, attempts, next_attempt_at, last_error, held_at
)
SELECT id, mod(hashtext(key) & 2147483647, 16), topic, key, txid::text::bigint, position,
    txid::text::bigint, position, created_at, 10,
    NULL, 'MSG_TIMED_OUT: Local: Message timed out', created_at
FROM outbox_event
WHERE id IN (SELECT md5('bench-' || g)::uuid
             FROM generate_series(1, %(events)s - 1, 2000) AS g)
"""

INBOX_SQL = """
INSERT INTO inbox_message (
    event_id, consumer_group, topic, partition, "offset", key, event_type, aggregate_type,
    aggregate_id, headers, raw_value, raw_value_encoding, status, attempts, last_error,
    published_at, received_at, processed_at, duplicate_count, last_duplicate_at
)
SELECT
    o.id::text, grp, o.topic, o.kafka_partition, o.kafka_offset, o.key, o.type, 'order',
    o.aggregateid, '{}'::jsonb, '', '', 'DONE', 1, '', o.published_at,
    processed - interval '2 milliseconds', processed,
    -- 1% of (event, group) pairs come more than once: 0.9% twice, 0.1% three times, so
    -- duplicate deliveries are 1.1% of the pairs (1.09% of all deliveries)
    CASE WHEN chance < 0.001 THEN 2 WHEN chance < 0.01 THEN 1 ELSE 0 END,
    CASE WHEN chance < 0.01 THEN processed END
FROM (
    SELECT o.*, d.kafka_partition, d.kafka_offset, d.published_at, grp, random() AS chance,
        -- log-normal consume lag: median 200 ms, long tail
        d.published_at + make_interval(secs => exp(ln(0.2)
            + 1.1 * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()))) AS processed
    FROM outbox_event o
    JOIN outbox_delivery d ON d.event_id = o.id AND d.outcome = 'PUBLISHED'
    CROSS JOIN (VALUES ('group-a'), ('group-b')) AS groups(grp)
    WHERE (grp = 'group-a' OR mod(right(o.topic, 1)::int, 2) = 0)
        -- one in ten thousand is never consumed: "not consumed" findings
        AND mod(d.kafka_offset, 10007) <> 3
) AS o
"""

# Percentiles of every (hour, topic, event type, group, stage), as the job computes them.
PERCENTILE_SQL = """
WITH lags AS (
    SELECT date_trunc('hour', created_at AT TIME ZONE 'UTC') AS hour, topic, type AS event_type,
        '' AS consumer_group, 'publish' AS stage,
        extract(epoch FROM d.published_at - o.created_at) AS lag
    FROM outbox_event o
    JOIN outbox_delivery d ON d.event_id = o.id AND d.outcome = 'PUBLISHED'
    WHERE o.created_at >= %(since)s AND o.created_at < %(until)s
    UNION ALL
    SELECT date_trunc('hour', o.created_at AT TIME ZONE 'UTC'), o.topic, o.type,
        i.consumer_group, s.stage,
        extract(epoch FROM i.processed_at - CASE WHEN s.stage = 'consume'
            THEN coalesce(d.published_at, i.published_at) ELSE o.created_at END)
    FROM inbox_message i
    JOIN outbox_event o ON o.id::text = i.event_id
    LEFT JOIN outbox_delivery d ON d.event_id = o.id AND d.outcome = 'PUBLISHED'
    CROSS JOIN (VALUES ('consume'), ('end_to_end')) AS s(stage)
    WHERE o.created_at >= %(since)s AND o.created_at < %(until)s AND i.processed_at IS NOT NULL
)
SELECT hour, topic, event_type, consumer_group, stage, count(*),
    percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY lag), max(lag)
FROM lags GROUP BY 1, 2, 3, 4, 5
"""


def _jvm_peak_bytes(spark: Any) -> int | None:
    """The driver JVM's peak resident set (VmHWM), read before the JVM stops."""
    try:
        pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except Exception:  # a measurement, not a result: report it missing
        return None
    return None


def _jvm_cpu_seconds(spark: Any) -> float | None:
    """User + system CPU time of the driver JVM so far (the executors run in it, locally)."""
    try:
        pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:  # a measurement, not a result: report it missing
        return None


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _mb(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 1024 / 1024:,.0f} MB"


def _database_check(name: str) -> None:
    """The benchmark empties the outbox and inbox tables: Django must be connected to the
    benchmark's own database, whatever the settings module makes of DATABASE_URL."""
    from django.db import connection

    actual = str(connection.settings_dict["NAME"])
    if actual != name or not actual.endswith(BENCH_SUFFIX):
        raise SystemExit(
            f"The benchmark empties the outbox and inbox tables: it runs only on its own "
            f"database {name!r}, but Django is connected to {actual!r}."
        )


def _generate(*, events: int, reuse: bool, since: datetime) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        if reuse:
            cursor.execute("SELECT count(*) FROM outbox_event")
            row = cursor.fetchone()
            if row and row[0] == events:
                print(f"data: reusing {events:,} events")
                return
        started = time.monotonic()
        cursor.execute("TRUNCATE outbox_event, outbox_delivery, outbox_held_event, inbox_message")
        params: dict[str, int | datetime] = {
            "events": events,
            "start": since,
            "seconds": BENCH_HOURS * 3600 - 1,
            "types": EVENT_TYPES,
            "topics": TOPICS,
        }
        cursor.execute(EVENTS_SQL, params)
        cursor.execute(DELIVERIES_SQL, params)
        cursor.execute(HELD_SQL, params)
        cursor.execute(INBOX_SQL)
        cursor.execute("ANALYZE outbox_event")
        cursor.execute("ANALYZE outbox_delivery")
        cursor.execute("ANALYZE inbox_message")
        cursor.execute("SELECT count(*), sum(duplicate_count) FROM inbox_message")
        inbox_rows, duplicates = cursor.fetchone() or (0, 0)
    print(
        f"data: {events:,} outbox events and {inbox_rows:,} inbox rows "
        f"({duplicates:,} duplicate deliveries) generated in {time.monotonic() - started:.1f} s"
    )


def _compare(*, run: "AnalyticsRun", since: datetime, until: datetime) -> None:
    from django.db import connection

    from analytics.models import DeliveryLagStat

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(PERCENTILE_SQL, {"since": since, "until": until})
        rows = cursor.fetchall()
    elapsed = time.monotonic() - started
    postgres = {
        (hour.replace(tzinfo=UTC), topic, event_type, group, stage): (count, pcts, top)
        for hour, topic, event_type, group, stage, count, pcts, top in rows
    }
    spark = {
        (s.hour, s.topic, s.event_type, s.consumer_group, s.stage): s
        for s in DeliveryLagStat.objects.filter(run=run)
    }
    print(
        f"postgresql: the same {len(postgres)} percentile groups in one query "
        f"(percentile_cont), {elapsed:.1f} s; Spark stored {len(spark)}"
    )
    differences: dict[str, list[float]] = {"p50": [], "p95": [], "p99": []}
    count_mismatches = 0
    for key, (count, pcts, _) in postgres.items():
        stat = spark.get(key)
        if stat is None or stat.count != count:
            count_mismatches += 1
            continue
        for name, value in zip(("p50", "p95", "p99"), pcts, strict=True):
            exact = float(value)
            differences[name].append(abs(getattr(stat, name) - exact) / max(abs(exact), 1e-9))
    print(f"counts that differ: {count_mismatches}")
    for name, values in differences.items():
        if values:
            print(
                f"{name}: relative difference Spark vs PostgreSQL, median "
                f"{statistics.median(values):.2e}, max {max(values):.2e} "
                f"over {len(values)} groups"
            )
    _overall(run=run)


def _overall(*, run: "AnalyticsRun") -> None:
    """One line per stage for the eye: the busiest group's percentiles side by side."""
    from django.db import connection

    from analytics.models import DeliveryLagStat

    print(f"{'group':<62} {'source':<10} {'count':>8} {'p50':>9} {'p95':>9} {'p99':>9}")
    for stage in DeliveryLagStat.Stage.values:
        stat = DeliveryLagStat.objects.filter(run=run, stage=stage).order_by("-count").first()
        if stat is None:
            continue
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT * FROM ({PERCENTILE_SQL}) AS p "  # noqa: S608
                "WHERE hour = %(hour)s AND topic = %(topic)s AND event_type = %(type)s "
                "AND consumer_group = %(group)s AND stage = %(stage)s",
                {
                    "since": stat.hour,
                    "until": stat.hour + timedelta(hours=1),
                    "hour": stat.hour.replace(tzinfo=None),
                    "topic": stat.topic,
                    "type": stat.event_type,
                    "group": stat.consumer_group,
                    "stage": stage,
                },
            )
            row = cursor.fetchone()
        label = (
            f"{stat.hour:%m-%d %H}h {stat.topic} {stat.event_type} "
            f"{stat.consumer_group or '-'} {stage}"
        )
        _row(label, "spark", stat.count, (stat.p50, stat.p95, stat.p99))
        if row:
            _row("", "postgresql", row[5], tuple(float(v) for v in row[6]))


def _row(label: str, source: str, count: int, percentiles: tuple[float, ...]) -> None:
    p50, p95, p99 = percentiles
    print(f"{label:<62} {source:<10} {count:>8} {p50:>9.4f} {p95:>9.4f} {p99:>9.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--reuse", action="store_true", help="keep the data if it already has --events events"
    )
    arguments = parser.parse_args()

    url = sibling_database_url(BENCH_SUFFIX)
    name = database_name(url)
    if ensure_database(url):
        print(f"created database {name}")
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from analytics.models import AnalyticsRun

    _database_check(name)
    call_command("migrate", verbosity=0)
    events = arguments.events
    since = BENCH_START
    until = BENCH_START + timedelta(hours=BENCH_HOURS)
    _generate(events=events, reuse=arguments.reuse, since=since)

    from analytics.services import analytics_run_execute
    from analytics.spark import spark_session_get

    print(
        f"job: SPARK_MASTER={settings.SPARK_MASTER}, driver memory "
        f"{settings.SPARK_DRIVER_MEMORY}, {settings.ANALYTICS_JDBC_PARTITIONS} JDBC "
        "partitions per table, Kafka scan off (the generated events are not in Kafka)"
    )
    load_before = _load()
    started = time.monotonic()
    spark = spark_session_get(app_name="analytics-bench")
    spark_started = time.monotonic() - started
    run = analytics_run_execute(
        since=since,
        until=until,
        trigger=AnalyticsRun.Trigger.BENCHMARK,
        spark=spark,
        kafka_scan=False,
    )
    wall = time.monotonic() - started
    jvm_peak = _jvm_peak_bytes(spark)
    jvm_cpu = _jvm_cpu_seconds(spark)
    load_after = _load()
    python_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if run.status != AnalyticsRun.Status.SUCCEEDED:
        raise SystemExit(f"the job failed: {run.error}")
    print(
        f"job: {wall:.1f} s wall ({spark_started:.1f} s Spark start), {run.rows_read:,} rows "
        f"read (outbox {run.outbox_rows:,}, inbox {run.inbox_rows:,}), "
        f"{run.rows_read / wall:,.0f} rows/s, {run.outbox_rows / wall:,.0f} events/s; "
        f"peak memory: driver JVM {_mb(jvm_peak)}, Python {_mb(python_peak)}; "
        f"{run.findings} findings {run.summary}"
    )
    cpu = "n/a" if jvm_cpu is None else f"{jvm_cpu:.1f} s"
    print(
        f"job: driver JVM CPU time {cpu} (the machine has {os.cpu_count()} cores); "
        f"load average (1, 5, 15 min) before {load_before}, after {load_after}"
    )
    _compare(run=run, since=since, until=until)


if __name__ == "__main__":
    main()
