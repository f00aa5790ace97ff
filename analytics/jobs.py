"""The Spark side of the analytics job: reads a window of outbox and inbox history (and the
Kafka log), computes lag, duplicate and relay statistics and the reconciliation findings,
and hands them back as plain Python values. It writes nothing: analytics/services.py stores
the results in one database transaction, so a job that fails leaves no partial results.

A window holds the outbox events created in [since, until); their inbox rows are included
whenever they were received. An hour is the hour (UTC) in which the event was created. An
event's status, attempts and publication are read as users see them, from its delivery records
and held event (the event row is written once and says nothing of its delivery): see
DELIVERY_JOIN_SQL.
"""

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from analytics.errors import SourceUnreachable

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

logger = logging.getLogger(__name__)

PERCENTILES = (0.5, 0.95, 0.99)
# Inbox rows received this long before the window opened are read too: the clocks of the
# relay's and the consumers' hosts may disagree a little.
INBOX_CLOCK_SKEW = timedelta(minutes=5)
# A Kafka record's timestamp is the producing host's clock at produce() (CreateTime, which the
# relay leaves to librdkafka) or the broker's (LogAppendTime); an event's created_at is the
# publishing host's. Every copy of a window's event was produced after the event was created,
# so its timestamp is at least the window's start, less this for clocks that disagree.
RECORD_CLOCK_SKEW = timedelta(minutes=5)
EVENT_ID_HEADER = "event_id"
MICROS_PER_SECOND = 1_000_000


@dataclass(frozen=True)
class JdbcSource:
    """Where the job reads the outbox and inbox tables (PostgreSQL over JDBC)."""

    host: str
    port: int
    database: str
    user: str
    password: str = field(repr=False)
    # The other servers ("host:port") of a DATABASES entry that names several, as a
    # connection string for failover does (docs/integration.md): the driver reads from
    # whichever of them is the primary.
    other_servers: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        servers = ",".join((f"{self.host}:{self.port}", *self.other_servers))
        primary = "?targetServerType=primary" if self.other_servers else ""
        return f"jdbc:postgresql://{servers}/{self.database}{primary}"

    @classmethod
    def from_settings_dict(cls, settings_dict: dict[str, Any]) -> "JdbcSource":
        # libpq's lists: one port for every host, or one per host.
        hosts = str(settings_dict.get("HOST") or "127.0.0.1").split(",")
        ports = str(settings_dict.get("PORT") or 5432).split(",")
        if len(ports) == 1:
            ports *= len(hosts)
        if len(ports) != len(hosts):
            raise ValueError(
                f"DATABASES names {len(hosts)} hosts and {len(ports)} ports: give one port, "
                "or one per host"
            )
        return cls(
            host=hosts[0],
            port=int(ports[0]),
            database=settings_dict["NAME"],
            user=settings_dict.get("USER") or "",
            password=settings_dict.get("PASSWORD") or "",
            other_servers=tuple(
                f"{host}:{int(port)}" for host, port in zip(hosts[1:], ports[1:], strict=True)
            ),
        )


@dataclass(frozen=True)
class JobConfig:
    since: datetime
    until: datetime
    # Findings are judged as of this instant: an event is late only once its SLA has passed.
    as_of: datetime
    source: JdbcSource
    consume_sla: timedelta = timedelta(minutes=5)
    expected_consumers: dict[str, list[str]] = field(default_factory=dict)
    jdbc_partitions: int = 4
    jdbc_fetch_size: int = 10_000
    percentile_accuracy: int = 10_000
    kafka_scan: bool = True
    # librdkafka-style client properties; bootstrap.servers is required for the scan.
    kafka_config: dict[str, str] = field(default_factory=dict)
    kafka_timeout_seconds: float = 10.0
    max_findings_per_kind: int = 10_000


@dataclass
class JobResult:
    outbox_rows: int = 0
    inbox_rows: int = 0
    kafka_records: int = 0
    lag_stats: list[dict[str, Any]] = field(default_factory=list)
    duplicate_stats: list[dict[str, Any]] = field(default_factory=list)
    relay_stats: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    # Every finding counted, also those past the per-kind cap; plus scan facts.
    summary: dict[str, int] = field(default_factory=dict)

    @property
    def rows_read(self) -> int:
        return self.outbox_rows + self.inbox_rows + self.kafka_records


def _aware(value: datetime | None) -> datetime | None:
    """PySpark hands timestamps back naive, in the Python process's local time zone."""
    if value is None or value.tzinfo is not None:
        return value
    return value.astimezone(UTC)


def _sql_timestamp(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _java_message(error: BaseException) -> str:
    """The Java exception's own message, without the stack trace Py4J appends."""
    java_exception = getattr(error, "java_exception", None)
    if java_exception is not None:
        try:
            return str(java_exception.toString())
        except Exception:  # the gateway may be gone; fall back to the Python text
            logger.debug("could not read the Java exception", exc_info=True)
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _jdbc_read(
    spark: "SparkSession",
    config: JobConfig,
    *,
    query: str,
    partition_column: str,
    lower: datetime,
    upper: datetime,
) -> "DataFrame":
    """A partitioned read: at most `jdbc_partitions` connections, each streaming its range."""
    source = config.source
    reader = (
        spark.read.format("jdbc")
        .option("url", source.url)
        .option("user", source.user)
        .option("password", source.password)
        .option("driver", "org.postgresql.Driver")
        .option("dbtable", f"({query}) AS source")
        .option("partitionColumn", partition_column)
        .option("lowerBound", _sql_timestamp(lower))
        .option("upperBound", _sql_timestamp(max(upper, lower + timedelta(seconds=1))))
        .option("numPartitions", str(config.jdbc_partitions))
        .option("fetchsize", str(config.jdbc_fetch_size))
        .option("connectTimeout", "10")
        # Binary transfer from the first execution: numbers and timestamps are not printed
        # as text by PostgreSQL and parsed back by the driver.
        .option("prepareThreshold", "-1")
    )
    try:
        return reader.load()
    except Exception as error:
        raise SourceUnreachable(
            f"Could not read the database {source.database} at {source.host}:{source.port} "
            f"over JDBC: {_java_message(error)}"
        ) from error


def _window_sql(config: JobConfig, column: str) -> str:
    # The bounds are datetimes of ours rendered by _sql_timestamp, never user text.
    return (
        f"{column} >= '{_sql_timestamp(config.since)}'::timestamp AT TIME ZONE 'UTC' "
        f"AND {column} < '{_sql_timestamp(config.until)}'::timestamp AT TIME ZONE 'UTC'"
    )


def _sql_string(value: str) -> str:
    """A PostgreSQL string literal (standard_conforming_strings, PostgreSQL's default)."""
    if "\x00" in value:
        raise ValueError("a NUL character cannot be sent to PostgreSQL")
    return "'" + value.replace("'", "''") + "'"


def _seconds_sql(end: str, start: str) -> str:
    # date_part on the interval: double precision arithmetic on its microseconds (extract()
    # would compute an exact numeric first, which costs more than the join).
    return f"date_part('epoch', {end} - {start})"


def _interval_sql(value: timedelta) -> str:
    # Intervals compare exactly, to the microsecond.
    return f"'{value // timedelta(microseconds=1)} microseconds'::interval"


# The UTC hour of an event's creation, as hours since the epoch: a cheap grouping key.
HOUR_SQL = "floor(extract(epoch FROM {column}) / 3600)::bigint"


def _window_read(
    spark: "SparkSession", config: JobConfig, *, query: str, partition_column: str = "created_at"
) -> "DataFrame":
    """A read of the window's outbox rows (and what PostgreSQL joins to them), partitioned on
    the outbox's created_at, which the window bounds: the ranges hold similar row counts."""
    return _jdbc_read(
        spark,
        config,
        query=query,
        partition_column=partition_column,
        lower=config.since,
        upper=config.until,
    )


def _deadline_sql(config: JobConfig) -> str:
    """Events published (or, PENDING, created) up to this instant are judged: their SLA has
    passed when the run starts."""
    return f"'{_sql_timestamp(config.as_of - config.consume_sla)}'::timestamp AT TIME ZONE 'UTC'"


# An event's delivery as users see it: the rule of outbox.selectors.outbox_events_with_delivery,
# in SQL. The relay never updates the event row: it appends delivery records, one per try
# (FAILED or PUBLISHED) and one per discard (DISCARDED), and holds the failed keys' events. A
# held event is PENDING, or FAILED once its attempts are spent; otherwise the latest PUBLISHED
# or DISCARDED record decides (DISCARDED is FAILED), and the latest PUBLISHED one tells when
# and where the event went. An event with neither is PENDING: the relay has not sent it yet.
#
# Attempts are those of the event's latest delivery (a replay starts again from 0): a held
# event's own count, or the tries since the final record before the latest one. The console's
# delivery_attempts counts every try of the event's life instead.
#
# The event's records are summed up in one probe of the delivery table's event_id index, in
# the lateral join (`finals_from` counts the final records from each record on); the held
# events are few, and hash joined.
DELIVERY_JOIN_SQL = """
LEFT JOIN outbox_held_event held ON held.event_id = event.id
LEFT JOIN LATERAL (
    SELECT
        (array_agg(record.outcome ORDER BY record.id DESC)
            FILTER (WHERE record.final))[1] AS final_outcome,
        (array_agg(record.published_at ORDER BY record.id DESC)
            FILTER (WHERE record.outcome = 'PUBLISHED'))[1] AS published_at,
        (array_agg(record.kafka_partition ORDER BY record.id DESC)
            FILTER (WHERE record.outcome = 'PUBLISHED'))[1] AS kafka_partition,
        (array_agg(record.kafka_offset ORDER BY record.id DESC)
            FILTER (WHERE record.outcome = 'PUBLISHED'))[1] AS kafka_offset,
        count(*) FILTER (WHERE record.tried AND record.finals_from <= 1) AS tries
    FROM (
        SELECT id, outcome, published_at, kafka_partition, kafka_offset,
               outcome IN ('PUBLISHED', 'DISCARDED') AS final,
               outcome IN ('PUBLISHED', 'FAILED') AS tried,
               count(*) FILTER (WHERE outcome IN ('PUBLISHED', 'DISCARDED'))
                   OVER (ORDER BY id DESC) AS finals_from
        FROM outbox_delivery WHERE event_id = event.id
    ) AS record
) AS delivery ON true
"""
DELIVERY_STATUS_SQL = """
CASE WHEN held.event_id IS NOT NULL THEN
          CASE WHEN held.next_attempt_at IS NULL AND held.attempts > 0 THEN 'FAILED'
               ELSE 'PENDING' END
     WHEN delivery.final_outcome = 'PUBLISHED' THEN 'DONE'
     WHEN delivery.final_outcome = 'DISCARDED' THEN 'FAILED'
     ELSE 'PENDING' END
"""
DELIVERY_ATTEMPTS_SQL = """
(CASE WHEN held.event_id IS NOT NULL THEN held.attempts ELSE delivery.tries END)::integer
"""
# The xmin of the snapshot of the relay's oldest current cursor (the latest cursor row of each
# shard; outbox.selectors.outbox_log_cursor_snapshot reads the same): every event committed
# before it is delivered, held or discarded, so an event that is PENDING and not held has a
# transaction id at or after it. Read once per statement (an InitPlan); null with no cursor.
CURSOR_XMIN_SQL = """
(SELECT pg_snapshot_xmin(tick.snapshot) FROM outbox_tick AS tick
 WHERE tick.id = (
     SELECT min(latest.tick_id)
     FROM (SELECT DISTINCT unnest(shards) AS shard FROM outbox_relay_cursor) AS shard
     CROSS JOIN LATERAL (
         SELECT cursor.tick_id FROM outbox_relay_cursor AS cursor
         WHERE shard.shard = ANY(cursor.shards) ORDER BY cursor.id DESC LIMIT 1
     ) AS latest
 ))
"""
# True for every PENDING event, from the event row and the held set alone (no delivery
# records): held, or committed after the cursors (or, with no cursor or no transaction id,
# not known to be past them).
MAYBE_PENDING_SQL = (
    f"(held.event_id IS NOT NULL OR coalesce(event.txid >= {CURSOR_XMIN_SQL.strip()}, true))"
)


def _outbox_sql(config: JobConfig) -> str:
    """The window's outbox events, each with its delivery (status, attempts, published_at,
    kafka_partition, kafka_offset) as users see it: a derived table that PostgreSQL pulls up
    into the query that reads it, so a partitioned read's range of created_at reaches the
    index on the events' created_at. `maybe_pending` is true for every PENDING event and
    needs no delivery records (MAYBE_PENDING_SQL): a filter on it spares the other events
    their probe."""
    return (
        "(SELECT event.id, event.topic, event.type, event.created_at, "  # noqa: S608
        f"{MAYBE_PENDING_SQL} AS maybe_pending, "
        f"{DELIVERY_STATUS_SQL} AS status, {DELIVERY_ATTEMPTS_SQL} AS attempts, "
        "delivery.published_at, delivery.kafka_partition, delivery.kafka_offset "
        f"FROM outbox_event event {DELIVERY_JOIN_SQL}"
        f"WHERE {_window_sql(config, 'event.created_at')})"
    )


def read_outbox(spark: "SparkSession", config: JobConfig) -> "DataFrame":
    """The window's outbox events, with their delivery, hour and publish lag computed by
    PostgreSQL, and whether each is due to be consumed (DONE, published before the SLA's
    deadline) or stuck (PENDING, created before it)."""
    deadline = _deadline_sql(config)
    query = (
        "SELECT o.id::text AS event_id, o.topic, o.type AS event_type, o.status, "  # noqa: S608
        "o.attempts, o.created_at, o.published_at, o.kafka_partition, o.kafka_offset, "
        f"{HOUR_SQL.format(column='o.created_at')} AS hour_epoch, "
        f"{_seconds_sql('o.published_at', 'o.created_at')} AS publish_lag, "
        f"(o.status = 'DONE' AND o.published_at <= {deadline})::int AS due, "
        f"(o.status = 'PENDING' AND o.created_at <= {deadline})::int AS stuck "
        f"FROM {_outbox_sql(config)} AS o"
    )
    return _window_read(spark, config, query=query)


def read_received(spark: "SparkSession", config: JobConfig) -> "DataFrame":
    """The inbox rows of the window's events (received from the window's start, less the
    clock skew, on), each with its event's hour, topic and type, and its consume and
    end-to-end lags (null until processed). PostgreSQL joins them to the outbox rows in each
    partition's range of created_at: on an index of the inbox's event ids for a short window,
    by a hash join for a long one."""
    since = _sql_timestamp(config.since - INBOX_CLOCK_SKEW)
    published = "coalesce(o.published_at, i.published_at)"
    query = (
        "SELECT i.event_id, i.consumer_group, i.duplicate_count, o.topic, "  # noqa: S608
        "o.type AS event_type, o.created_at, "
        f"{HOUR_SQL.format(column='o.created_at')} AS hour_epoch, "
        f"{_seconds_sql('i.processed_at', published)} AS consume_lag, "
        f"{_seconds_sql('i.processed_at', 'o.created_at')} AS end_to_end_lag, "
        # A due event that this group recorded within the SLA: not a "not consumed" finding.
        f"(o.status = 'DONE' AND o.published_at <= {_deadline_sql(config)} "
        f"AND i.received_at - o.published_at <= {_interval_sql(config.consume_sla)})::int "
        "AS recorded_in_time "
        f"FROM inbox_message i JOIN {_outbox_sql(config)} AS o ON o.id::text = i.event_id "
        f"WHERE i.received_at >= '{since}'::timestamp AT TIME ZONE 'UTC'"
    )
    return _window_read(spark, config, query=query)


def _local_frame(
    spark: "SparkSession", columns: list[tuple[str, str]], rows: list[tuple[Any, ...]]
) -> "DataFrame":
    """A small DataFrame built from literals in the JVM: unlike createDataFrame on a Python
    list, it needs no Python worker on the executors of a cluster."""
    from pyspark.sql import functions as F

    if not rows:
        return spark.range(0).select(
            *[F.lit(None).cast(kind).alias(name) for name, kind in columns]
        )
    structs = [
        F.struct(
            *[
                F.lit(value).cast(kind).alias(name)
                for value, (name, kind) in zip(row, columns, strict=True)
            ]
        )
        for row in rows
    ]
    return spark.range(1).select(F.inline(F.array(*structs)))


def _seconds_between(end: "Column | str", start: "Column | str") -> "Column":
    from pyspark.sql import functions as F

    return (F.unix_micros(end) - F.unix_micros(start)) / MICROS_PER_SECOND


def _lag_aggregations(column: str, prefix: str, accuracy: int) -> list["Column"]:
    from pyspark.sql import functions as F

    # Nulls (not yet published or processed) are neither counted nor ranked.
    return [
        F.count(column).alias(f"{prefix}_count"),
        F.percentile_approx(column, list(PERCENTILES), accuracy).alias(f"{prefix}_percentiles"),
        F.max(column).alias(f"{prefix}_max"),
    ]


def _hour(hour_epoch: int) -> datetime:
    return datetime.fromtimestamp(hour_epoch * 3600, tz=UTC)


def _lag_row(
    row: Any, key: dict[str, Any], prefix: str, stage: str, consumer_group: str
) -> dict[str, Any] | None:
    count = row[f"{prefix}_count"]
    if not count:
        return None
    p50, p95, p99 = row[f"{prefix}_percentiles"]
    return {
        **key,
        "consumer_group": consumer_group,
        "stage": stage,
        "count": count,
        "p50": p50,
        "p95": p95,
        "p99": p99,
        "max": row[f"{prefix}_max"],
    }


def outbox_aggregate(outbox: "DataFrame", accuracy: int) -> list[Any]:
    """One pass over the outbox rows: publish lag percentiles and the relay's counts per
    hour, topic and event type."""
    from pyspark.sql import functions as F

    def count_where(condition: "Column") -> "Column":
        return F.sum(F.when(condition, 1).otherwise(0))

    return (
        outbox.groupBy("hour_epoch", "topic", "event_type")
        .agg(
            F.count(F.lit(1)).alias("events"),
            count_where(F.col("status") == "DONE").alias("published"),
            count_where(F.col("status") == "PENDING").alias("pending"),
            count_where(F.col("status") == "FAILED").alias("failed"),
            count_where(F.col("attempts") > 1).alias("retried"),
            F.max("attempts").alias("max_attempts"),
            F.sum("due").alias("due"),
            F.sum("stuck").alias("stuck"),
            *_lag_aggregations("publish_lag", "publish", accuracy),
        )
        .collect()
    )


def received_aggregate(received: "DataFrame", accuracy: int) -> list[Any]:
    """One pass over the inbox rows: consume and end-to-end lag percentiles and the
    duplicate counts per hour, topic, event type and consumer group."""
    from pyspark.sql import functions as F

    return (
        received.groupBy("hour_epoch", "topic", "event_type", "consumer_group")
        .agg(
            # The inbox keeps one row per (group, event id): a row is one unique event.
            F.count(F.lit(1)).alias("unique_events"),
            F.sum("duplicate_count").alias("duplicate_deliveries"),
            F.max("duplicate_count").alias("max_duplicates"),
            F.sum("recorded_in_time").alias("recorded_in_time"),
            *_lag_aggregations("consume_lag", "consume", accuracy),
            *_lag_aggregations("end_to_end_lag", "end_to_end", accuracy),
        )
        .collect()
    )


def lag_stats(outbox_rows: list[Any], received_rows: list[Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any] | None] = []
    for row in outbox_rows:
        key = {"hour": _hour(row["hour_epoch"]), "topic": row["topic"]}
        key["event_type"] = row["event_type"]
        rows.append(_lag_row(row, key, "publish", "publish", ""))
    for row in received_rows:
        key = {"hour": _hour(row["hour_epoch"]), "topic": row["topic"]}
        key["event_type"] = row["event_type"]
        group = row["consumer_group"]
        rows.append(_lag_row(row, key, "consume", "consume", group))
        rows.append(_lag_row(row, key, "end_to_end", "end_to_end", group))
    return [row for row in rows if row is not None]


def duplicate_stats(received_rows: list[Any]) -> list[dict[str, Any]]:
    """Per hour, topic and group: the event types' counts added up (sums and maxima)."""
    totals: dict[tuple[int, str, str], list[int]] = {}
    for row in received_rows:
        key = (row["hour_epoch"], row["topic"], row["consumer_group"])
        total = totals.setdefault(key, [0, 0, 0])
        total[0] += int(row["unique_events"])
        total[1] += int(row["duplicate_deliveries"] or 0)
        total[2] = max(total[2], int(row["max_duplicates"] or 0))
    stats = []
    for (hour_epoch, topic, group), (unique_events, duplicates, most) in sorted(totals.items()):
        deliveries = unique_events + duplicates
        stats.append(
            {
                "hour": _hour(hour_epoch),
                "topic": topic,
                "consumer_group": group,
                "deliveries": deliveries,
                "unique_events": unique_events,
                "duplicate_deliveries": duplicates,
                "duplicate_rate": duplicates / deliveries if deliveries else 0.0,
                "max_copies": 1 + most,
            }
        )
    return stats


RELAY_COUNTS = ("events", "published", "pending", "failed", "retried")


def relay_stats(outbox_rows: list[Any]) -> list[dict[str, Any]]:
    """Per hour and topic: the event types' counts added up."""
    totals: dict[tuple[int, str], dict[str, int]] = {}
    for row in outbox_rows:
        total = totals.setdefault(
            (row["hour_epoch"], row["topic"]), dict.fromkeys((*RELAY_COUNTS, "max_attempts"), 0)
        )
        for name in RELAY_COUNTS:
            total[name] += int(row[name])
        total["max_attempts"] = max(total["max_attempts"], int(row["max_attempts"] or 0))
    stats = []
    for (hour_epoch, topic), total in sorted(totals.items()):
        events = total["events"]
        stats.append(
            {
                "hour": _hour(hour_epoch),
                "topic": topic,
                **total,
                "retry_rate": total["retried"] / events,
                "failure_rate": total["failed"] / events,
            }
        )
    return stats


def _expected_groups(
    *,
    pairs: Iterable[tuple[str, str]],
    observed: dict[str, set[str]],
    configured: dict[str, list[str]],
) -> list[tuple[str, str, str]]:
    """(topic, event type, consumer group) for every group that must record those events."""
    expected: list[tuple[str, str, str]] = []
    for topic, event_type in pairs:
        if topic in configured or event_type in configured:
            groups = {*configured.get(topic, []), *configured.get(event_type, [])}
        else:
            groups = observed.get(topic, set())
        expected.extend((topic, event_type, group) for group in sorted(groups))
    return expected


def _finding_rows(
    frame: "DataFrame", kind: str, limit: int, detail: Any, *, total: int | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """The first `limit` findings by creation, and how many there are (`total` when the
    caller has counted them already)."""
    persisted = total is None
    if total is None:
        # Counted and listed from one computation: the join behind a finding runs once.
        frame = frame.persist()
        total = frame.count()
    count: int = total
    rows = []
    for row in frame.orderBy("created_at", "event_id").limit(limit).collect():
        values = row.asDict()
        rows.append(
            {
                "kind": kind,
                "event_id": values["event_id"],
                "topic": values["topic"],
                "event_type": values.get("event_type") or "",
                "consumer_group": values.get("consumer_group") or "",
                "created_at": _aware(values.get("created_at")),
                "published_at": _aware(values.get("published_at")),
                "kafka_partition": values.get("kafka_partition"),
                "kafka_offsets": values.get("kafka_offsets") or [],
                "detail": detail(values),
            }
        )
    if persisted:
        frame.unpersist()
    return count, rows


def _not_consumed_detail(sla_seconds: float) -> Any:
    def detail(values: dict[str, Any]) -> str:
        if values.get("received_at") is None:
            return f"no inbox row in group {values['consumer_group']}"
        late = (values["received_at"] - values["published_at"]).total_seconds()
        return (
            f"recorded by {values['consumer_group']} {late:.3f} s after publication "
            f"(SLA {sla_seconds:g} s)"
        )

    return detail


def reconcile_database(
    spark: "SparkSession",
    config: JobConfig,
    *,
    outbox_rows: list[Any],
    received_rows: list[Any],
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Stuck and not-consumed events: what the outbox and inbox tables alone tell.

    The aggregations have counted them exactly: stuck events, and for each expected (topic,
    event type, group), the due events less those the group recorded within the SLA (the
    inbox holds one row per group and event id). Only kinds with findings are listed, by a
    read of the problem rows alone: PostgreSQL applies the predicates and the anti-join, on
    the window's ranges of created_at, with its indexes."""
    from pyspark.sql import functions as F

    sla_seconds = config.consume_sla.total_seconds()
    deadline = _deadline_sql(config)
    limit = config.max_findings_per_kind
    counts = {"stuck": sum(int(row["stuck"] or 0) for row in outbox_rows), "not_consumed": 0}
    findings: list[dict[str, Any]] = []

    if counts["stuck"]:
        stuck_query = (
            "SELECT o.id::text AS event_id, o.topic, o.type AS event_type, "  # noqa: S608
            "o.attempts, o.created_at, o.published_at, o.kafka_partition "
            f"FROM {_outbox_sql(config)} AS o "
            f"WHERE o.maybe_pending AND o.status = 'PENDING' AND o.created_at <= {deadline}"
        )
        stuck = _window_read(spark, config, query=stuck_query).withColumn(
            "kafka_offsets", F.array().cast("array<bigint>")
        )
        findings += _finding_rows(
            stuck,
            "stuck",
            limit,
            lambda v: (
                f"PENDING after {v['attempts']} attempt(s), "
                f"created {v['created_at']:%Y-%m-%d %H:%M:%S}"
            ),
            total=counts["stuck"],
        )[1]

    due: dict[tuple[str, str], int] = {}
    for row in outbox_rows:
        pair = (row["topic"], row["event_type"])
        due[pair] = due.get(pair, 0) + int(row["due"] or 0)
    observed: dict[str, set[str]] = {}
    in_time: dict[tuple[str, str, str], int] = {}
    for row in received_rows:
        observed.setdefault(row["topic"], set()).add(row["consumer_group"])
        key = (row["topic"], row["event_type"], row["consumer_group"])
        in_time[key] = in_time.get(key, 0) + int(row["recorded_in_time"] or 0)
    expected = _expected_groups(
        pairs=sorted(due), observed=observed, configured=config.expected_consumers
    )
    missing = {
        key: due[(key[0], key[1])] - in_time.get(key, 0)
        for key in expected
        if due[(key[0], key[1])] > in_time.get(key, 0)
    }
    counts["not_consumed"] = sum(missing.values())
    if not missing:
        return counts, findings
    missing_sql = ", ".join(
        f"({_sql_string(topic)}, {_sql_string(event_type)}, {_sql_string(group)})"
        for topic, event_type, group in sorted(missing)
    )
    since = f"'{_sql_timestamp(config.since - INBOX_CLOCK_SKEW)}'::timestamp AT TIME ZONE 'UTC'"
    recorded = (
        "FROM inbox_message i WHERE i.event_id = o.id::text "
        f"AND i.consumer_group = e.consumer_group AND i.received_at >= {since}"
    )
    not_consumed_query = (
        "SELECT o.id::text AS event_id, o.topic, o.type AS event_type, "  # noqa: S608
        "e.consumer_group, o.created_at, o.published_at, o.kafka_partition, o.kafka_offset, "
        f"(SELECT i.received_at {recorded}) AS received_at FROM {_outbox_sql(config)} AS o "
        f"JOIN (VALUES {missing_sql}) AS e(topic, event_type, consumer_group) "
        "ON e.topic = o.topic AND e.event_type = o.type "
        f"WHERE o.status = 'DONE' AND o.published_at <= {deadline} "
        f"AND NOT EXISTS (SELECT 1 {recorded} "
        f"AND i.received_at - o.published_at <= {_interval_sql(config.consume_sla)})"
    )
    not_consumed = _window_read(spark, config, query=not_consumed_query).withColumn(
        "kafka_offsets",
        F.when(F.col("kafka_offset").isNull(), F.array().cast("array<bigint>")).otherwise(
            F.array("kafka_offset")
        ),
    )
    findings += _finding_rows(
        not_consumed,
        "not_consumed",
        limit,
        _not_consumed_detail(sla_seconds),
        total=counts["not_consumed"],
    )[1]
    return counts, findings


@dataclass(frozen=True)
class KafkaScanPlan:
    # topic -> partition -> (low watermark, first offset to read, end offset exclusive)
    partitions: dict[str, dict[int, tuple[int, int, int]]]

    @property
    def readable(self) -> dict[str, dict[int, tuple[int, int]]]:
        return {
            topic: {p: (start, end) for p, (_, start, end) in parts.items() if start < end}
            for topic, parts in self.partitions.items()
            if any(start < end for _, start, end in parts.values())
        }


def kafka_scan_plan(
    *, first_offsets: dict[tuple[str, int], int], topics: set[str], config: JobConfig
) -> KafkaScanPlan:
    """Asks the broker for each partition's watermarks and for its first offset of a record
    written since the window opened (less RECORD_CLOCK_SKEW). The scan reads from the lower of
    that offset and the window's first recorded offset (or from the log start, if retention
    removed them) to the log end: a copy of an event written before the one the relay
    recorded (its acknowledgement lost, or the relay killed before its record) may lie below
    every recorded offset, but never before the event was created."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    bootstrap = config.kafka_config.get("bootstrap.servers", "")
    consumer = Consumer(
        {
            **config.kafka_config,
            "group.id": "analytics-reconciliation",
            "enable.auto.commit": False,
            # The end of the scan is then the last stable offset, where read_committed stops.
            "isolation.level": "read_committed",
            "socket.connection.setup.timeout.ms": int(config.kafka_timeout_seconds * 1000),
        }
    )
    try:
        try:
            metadata = consumer.list_topics(timeout=config.kafka_timeout_seconds)
        except KafkaException as error:
            raise SourceUnreachable(
                f"Kafka at {bootstrap} did not answer within "
                f"{config.kafka_timeout_seconds:g} s: {error}"
            ) from error
        partitions: dict[str, dict[int, tuple[int, int, int]]] = {}
        for topic in sorted(topics):
            topic_metadata = metadata.topics.get(topic)
            if topic_metadata is None:
                # The list of all topics leaves out those this client may not describe; asked
                # by its name, the cluster says whether the topic is gone or refused.
                topic_metadata = _topic_metadata(consumer, topic, config)
            refusal = None if topic_metadata is None else topic_metadata.error
            if refusal is not None and refusal.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                # Not a topic that is gone (its events would all be counted missing): one
                # this client may not describe, say; the run fails saying so.
                raise SourceUnreachable(
                    f"Kafka at {bootstrap} refused the metadata of topic {topic}: {refusal}"
                )
            if topic_metadata is None or refusal is not None:
                # The topic is gone: each of its DONE events is missing from Kafka.
                partitions[topic] = {}
                continue
            partitions[topic] = {}
            recorded = {
                partition: first
                for partition in sorted(topic_metadata.partitions)
                if (first := first_offsets.get((topic, partition))) is not None
            }
            written_since = _offsets_written_since(consumer, topic, sorted(recorded), config)
            for partition, first in recorded.items():
                start = min(first, written_since.get(partition, first))
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=config.kafka_timeout_seconds
                    )
                except KafkaException as error:
                    raise SourceUnreachable(
                        f"Kafka at {bootstrap} gave no offsets for {topic}[{partition}]: {error}"
                    ) from error
                partitions[topic][partition] = (low, max(start, low), high)
        return KafkaScanPlan(partitions=partitions)
    finally:
        consumer.close()


def _topic_metadata(consumer: Any, topic: str, config: JobConfig) -> Any:
    """One topic's metadata, asked by its name (a consumer asks for no topic to be created)."""
    from confluent_kafka import KafkaException

    try:
        return consumer.list_topics(topic, timeout=config.kafka_timeout_seconds).topics.get(topic)
    except KafkaException as error:
        raise SourceUnreachable(
            f"Kafka at {config.kafka_config.get('bootstrap.servers', '')} gave no metadata of "
            f"topic {topic}: {error}"
        ) from error


def _offsets_written_since(
    consumer: Any, topic: str, partitions: list[int], config: JobConfig
) -> dict[int, int]:
    """Partition -> the first offset whose record's timestamp is at least the window's start
    less RECORD_CLOCK_SKEW (the broker's time index: no earlier record is that recent). A
    partition with no such record has no entry."""
    from confluent_kafka import KafkaException, TopicPartition

    if not partitions:
        return {}
    bootstrap = config.kafka_config.get("bootstrap.servers", "")
    timestamp_ms = int((config.since - RECORD_CLOCK_SKEW).timestamp() * 1000)
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(topic, partition, timestamp_ms) for partition in partitions],
            timeout=config.kafka_timeout_seconds,
        )
    except KafkaException as error:
        raise SourceUnreachable(
            f"Kafka at {bootstrap} gave no offsets by time for {topic}: {error}"
        ) from error
    offsets: dict[int, int] = {}
    for position in found:
        if position.error is not None:
            raise SourceUnreachable(
                f"Kafka at {bootstrap} gave no offset by time for "
                f"{topic}[{position.partition}]: {position.error}"
            )
        if position.offset >= 0:  # OFFSET_END (-1): no record that recent
            offsets[position.partition] = position.offset
    return offsets


# librdkafka's properties (KAFKA_EVENTS["CLIENT_CONFIG"]) that Spark's Java Kafka client names
# otherwise, or not at all. The others are passed on as they are: most names are the same in
# both clients, and the Java client ignores, with a warning in Spark's log, one it does not
# know.
_SASL_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_LIBRDKAFKA_ONLY = {
    "sasl.username",
    "sasl.password",
    "sasl.mechanisms",
    "ssl.ca.location",
    "ssl.endpoint.identification.algorithm",
}


def java_kafka_options(config: dict[str, str]) -> dict[str, str]:
    """The Java Kafka client's properties for a librdkafka configuration: SASL's user and
    password become `sasl.jaas.config` with the mechanism's login module, a CA file
    (`ssl.ca.location`, PEM) a PEM trust store, and `ssl.endpoint.identification.algorithm`
    `none` the Java client's empty value. A SASL user with a mechanism it has no login module
    for (GSSAPI, OAUTHBEARER) is refused: give `sasl.jaas.config` itself."""
    options = {key: value for key, value in config.items() if key not in _LIBRDKAFKA_ONLY}
    mechanism = config.get("sasl.mechanism") or config.get("sasl.mechanisms")
    if mechanism:
        options["sasl.mechanism"] = mechanism
    if "sasl.username" in config and "sasl.jaas.config" not in config:
        module = _SASL_LOGIN_MODULES.get((mechanism or "PLAIN").upper())
        if module is None:
            raise ValueError(
                f"the analytics job's Kafka scan cannot turn sasl.username into a Java login "
                f"for SASL mechanism {mechanism}: set sasl.jaas.config in CLIENT_CONFIG"
            )
        options["sasl.jaas.config"] = (
            f"{module} required username={_jaas_quoted(config['sasl.username'])} "
            f"password={_jaas_quoted(config.get('sasl.password', ''))};"
        )
    if "ssl.ca.location" in config:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.location"] = config["ssl.ca.location"]
    verification = config.get("ssl.endpoint.identification.algorithm")
    if verification is not None:
        options["ssl.endpoint.identification.algorithm"] = (
            "" if verification == "none" else verification
        )
    return options


def _jaas_quoted(value: str) -> str:
    """A JAAS option value in double quotes, its backslashes and quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_kafka(spark: "SparkSession", plan: KafkaScanPlan, config: JobConfig) -> "DataFrame":
    """The records of the planned offset ranges, with the event id from their header."""
    from pyspark.sql import functions as F

    readable = plan.readable
    assign = {topic: sorted(parts) for topic, parts in readable.items()}
    starting = {
        t: {str(p): start for p, (start, _) in parts.items()} for t, parts in readable.items()
    }
    ending = {t: {str(p): end for p, (_, end) in parts.items()} for t, parts in readable.items()}
    reader = (
        spark.read.format("kafka")
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("includeHeaders", "true")
        # Retention may remove records between planning and reading: they are not read then.
        .option("failOnDataLoss", "false")
    )
    for key, value in java_kafka_options(config.kafka_config).items():
        reader = reader.option(f"kafka.{key}", value)
    # As the inbox reads: the records of an aborted Kafka transaction (the relay's
    # transactional mode publishes such a batch again) are no copies, and no "re-sent".
    reader = reader.option("kafka.isolation.level", "read_committed")
    frame = reader.load()
    return frame.select(
        "topic",
        "partition",
        "offset",
        F.expr(f"try_element_at(filter(headers, h -> h.key = '{EVENT_ID_HEADER}'), 1).value")
        .cast("string")
        .alias("event_id"),
    )


def reconcile_kafka(
    spark: "SparkSession", outbox: "DataFrame", config: JobConfig
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Re-sent and missing events: the outbox's DONE events against the Kafka log."""
    from pyspark.sql import functions as F

    done = outbox.where(F.col("status") == "DONE")
    first_offsets = {
        (row["topic"], row["kafka_partition"]): row["first_offset"]
        for row in done.where(F.col("kafka_offset").isNotNull())
        .groupBy("topic", "kafka_partition")
        .agg(F.min("kafka_offset").alias("first_offset"))
        .collect()
    }
    topics = {row["topic"] for row in done.select("topic").distinct().collect()}
    counts = {"kafka_records": 0, "resent": 0, "missing_from_kafka": 0, "expired_from_kafka": 0}
    if not topics:
        return counts, []
    plan = kafka_scan_plan(first_offsets=first_offsets, topics=topics, config=config)

    scanned = _local_frame(
        spark,
        [("topic", "string"), ("kafka_partition", "int"), ("log_start", "bigint")],
        [
            (topic, partition, low)
            for topic, parts in plan.partitions.items()
            for partition, (low, _, _) in parts.items()
        ],
    )
    if plan.readable:
        records = read_kafka(spark, plan, config)
        try:
            counts["kafka_records"] = records.count()
        except Exception as error:
            raise SourceUnreachable(
                f"Could not read the Kafka log: {_java_message(error)}"
            ) from error
        window_records = records.join(done.select("event_id"), "event_id", "left_semi")
    else:
        window_records = _local_frame(
            spark,
            [
                ("topic", "string"),
                ("partition", "int"),
                ("offset", "bigint"),
                ("event_id", "string"),
            ],
            [],
        )
    window_records = window_records.persist()

    copies = window_records.groupBy("event_id").agg(
        F.count(F.lit(1)).alias("copies"),
        F.sort_array(F.collect_list(F.struct("partition", "offset"))).alias("positions"),
    )
    resent = (
        copies.where(F.col("copies") > 1)
        .join(done, "event_id")
        .withColumn("kafka_offsets", F.col("positions.offset"))
        .withColumn("kafka_partition", F.col("positions")[0]["partition"])
    )
    counts["resent"], rows = _finding_rows(
        resent,
        "resent",
        config.max_findings_per_kind,
        lambda v: (
            f"{v['copies']} copies in the log; the outbox recorded offset {v['kafka_offset']}"
        ),
    )
    findings = rows

    checked = done.join(F.broadcast(scanned), ["topic", "kafka_partition"], "left")
    expired = checked.where(F.col("kafka_offset") < F.col("log_start"))
    counts["expired_from_kafka"] = expired.count()
    missing = (
        checked.where(F.col("log_start").isNull() | ~(F.col("kafka_offset") < F.col("log_start")))
        .join(window_records.select("event_id"), "event_id", "left_anti")
        .withColumn(
            "kafka_offsets",
            F.when(F.col("kafka_offset").isNull(), F.array().cast("array<bigint>")).otherwise(
                F.array("kafka_offset")
            ),
        )
    )
    counts["missing_from_kafka"], rows = _finding_rows(
        missing,
        "missing_from_kafka",
        config.max_findings_per_kind,
        lambda v: (
            f"DONE at {v['topic']}[{v['kafka_partition']}]@{v['kafka_offset']}, "
            "not in the Kafka log"
        ),
    )
    findings += rows
    window_records.unpersist()
    return counts, findings


def _collect(config: JobConfig, action: Any) -> Any:
    """Runs a Spark action on the database reads; a database that stops answering midway
    is a SourceUnreachable, as one that never answered."""
    try:
        return action()
    except Exception as error:
        raise SourceUnreachable(
            f"Could not read the database {config.source.database} at "
            f"{config.source.host}:{config.source.port}: {_java_message(error)}"
        ) from error


def run_job(spark: "SparkSession", config: JobConfig) -> JobResult:
    """Two aggregations, one per table read, give every statistic; the findings are reads of
    the problem rows only. Nothing is cached but the DONE outbox rows the Kafka scan needs."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    clock = _PhaseClock()
    result = JobResult()
    accuracy = config.percentile_accuracy
    outbox = read_outbox(spark, config)
    outbox_rows = _collect(config, lambda: outbox_aggregate(outbox, accuracy))
    clock.lap("outbox: read, publish lag percentiles, relay counts")
    received_rows = _collect(
        config, lambda: received_aggregate(read_received(spark, config), accuracy)
    )
    clock.lap("inbox: read joined to the outbox, consume lag percentiles, duplicates")
    result.outbox_rows = sum(int(row["events"]) for row in outbox_rows)
    result.inbox_rows = sum(int(row["unique_events"]) for row in received_rows)
    result.lag_stats = lag_stats(outbox_rows, received_rows)
    result.duplicate_stats = duplicate_stats(received_rows)
    result.relay_stats = relay_stats(outbox_rows)

    counts, result.findings = _collect(
        config,
        lambda: reconcile_database(
            spark, config, outbox_rows=outbox_rows, received_rows=received_rows
        ),
    )
    clock.lap("stuck and not consumed")
    if config.kafka_scan:
        done = outbox.where(F.col("status") == "DONE").persist(StorageLevel.MEMORY_AND_DISK)
        try:
            kafka_counts, kafka_findings = reconcile_kafka(spark, done, config)
        finally:
            done.unpersist()
        result.kafka_records = kafka_counts.pop("kafka_records")
        counts.update(kafka_counts)
        result.findings += kafka_findings
        clock.lap("Kafka scan")
    result.summary = counts
    return result


class _PhaseClock:
    """Logs how long each phase of the job took, for tuning."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        logger.info("analytics job: %s took %.1f s", phase, now - self.last)
        self.last = now
