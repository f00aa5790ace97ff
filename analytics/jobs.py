"""The Spark side of the analytics job: reads a window of outbox and inbox history (and the
Kafka log), computes lag, duplicate and relay statistics and the reconciliation findings,
and hands them back as plain Python values. It writes nothing: analytics/services.py stores
the results in one database transaction, so a job that fails leaves no partial results.

A window holds the outbox events created in [since, until); their inbox rows are included
whenever they were received. An hour is the hour (UTC) in which the event was created.
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

    @property
    def url(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"

    @classmethod
    def from_settings_dict(cls, settings_dict: dict[str, Any]) -> "JdbcSource":
        return cls(
            host=settings_dict.get("HOST") or "127.0.0.1",
            port=int(settings_dict.get("PORT") or 5432),
            database=settings_dict["NAME"],
            user=settings_dict.get("USER") or "",
            password=settings_dict.get("PASSWORD") or "",
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
    )
    try:
        return reader.load()
    except Exception as error:
        raise SourceUnreachable(
            f"Could not read the database {source.database} at {source.host}:{source.port} "
            f"over JDBC: {_java_message(error)}"
        ) from error


def read_outbox(spark: "SparkSession", config: JobConfig) -> "DataFrame":
    from pyspark.sql import functions as F

    # The bounds are datetimes of ours rendered by _sql_timestamp, never user text.
    query = (
        "SELECT id::text AS event_id, topic, type AS event_type, status, attempts, "  # noqa: S608
        "created_at, published_at, kafka_partition, kafka_offset FROM outbox_event "
        f"WHERE created_at >= '{_sql_timestamp(config.since)}'::timestamp AT TIME ZONE 'UTC' "
        f"AND created_at < '{_sql_timestamp(config.until)}'::timestamp AT TIME ZONE 'UTC'"
    )
    frame = _jdbc_read(
        spark,
        config,
        query=query,
        partition_column="created_at",
        lower=config.since,
        upper=config.until,
    )
    return frame.withColumn("hour", F.date_trunc("hour", "created_at"))


def read_received(spark: "SparkSession", config: JobConfig, outbox: "DataFrame") -> "DataFrame":
    """The inbox rows of the window's events, each with its event's hour, topic, type,
    creation and publication. Inbox rows received from the window's start on are read (in
    `jdbc_partitions` ranges of received_at) and joined to the outbox rows in Spark."""
    from pyspark.sql import functions as F

    since = config.since - INBOX_CLOCK_SKEW
    query = (
        "SELECT event_id, consumer_group, published_at AS inbox_published_at, "  # noqa: S608
        "received_at, processed_at, duplicate_count FROM inbox_message "
        f"WHERE received_at >= '{_sql_timestamp(since)}'::timestamp AT TIME ZONE 'UTC'"
    )
    inbox = _jdbc_read(
        spark,
        config,
        query=query,
        partition_column="received_at",
        lower=since,
        upper=max(config.as_of, config.until),
    )
    events = outbox.select(
        "event_id",
        "hour",
        "topic",
        "event_type",
        "created_at",
        F.col("published_at").alias("outbox_published_at"),
    )
    return inbox.join(events, "event_id").withColumn(
        "event_published_at", F.coalesce("outbox_published_at", "inbox_published_at")
    )


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


def _lag_aggregations(column: "Column", prefix: str, accuracy: int) -> list["Column"]:
    from pyspark.sql import functions as F

    return [
        F.count(column).alias(f"{prefix}_count"),
        F.percentile_approx(column, list(PERCENTILES), accuracy).alias(f"{prefix}_percentiles"),
        F.max(column).alias(f"{prefix}_max"),
    ]


def _lag_row(row: Any, prefix: str, stage: str, consumer_group: str) -> dict[str, Any] | None:
    count = row[f"{prefix}_count"]
    if not count:
        return None
    p50, p95, p99 = row[f"{prefix}_percentiles"]
    return {
        "hour": _aware(row["hour"]),
        "topic": row["topic"],
        "event_type": row["event_type"],
        "consumer_group": consumer_group,
        "stage": stage,
        "count": count,
        "p50": p50,
        "p95": p95,
        "p99": p99,
        "max": row[f"{prefix}_max"],
    }


def lag_stats(outbox: "DataFrame", received: "DataFrame", accuracy: int) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    publish = (
        outbox.where(F.col("published_at").isNotNull())
        .withColumn("lag", _seconds_between("published_at", "created_at"))
        .groupBy("hour", "topic", "event_type")
        .agg(*_lag_aggregations(F.col("lag"), "publish", accuracy))
    )
    rows: list[dict[str, Any] | None] = [
        _lag_row(row, "publish", "publish", "") for row in publish.collect()
    ]
    consume = (
        received.where(F.col("processed_at").isNotNull())
        .withColumn("consume_lag", _seconds_between("processed_at", "event_published_at"))
        .withColumn("end_to_end_lag", _seconds_between("processed_at", "created_at"))
        .groupBy("hour", "topic", "event_type", "consumer_group")
        .agg(
            *_lag_aggregations(F.col("consume_lag"), "consume", accuracy),
            *_lag_aggregations(F.col("end_to_end_lag"), "end_to_end", accuracy),
        )
    )
    for row in consume.collect():
        rows.append(_lag_row(row, "consume", "consume", row["consumer_group"]))
        rows.append(_lag_row(row, "end_to_end", "end_to_end", row["consumer_group"]))
    return [row for row in rows if row is not None]


def duplicate_stats(received: "DataFrame") -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    grouped = received.groupBy("hour", "topic", "consumer_group").agg(
        # The inbox keeps one row per (group, event id): a row is one unique event.
        F.count(F.lit(1)).alias("unique_events"),
        F.sum("duplicate_count").alias("duplicate_deliveries"),
        F.max("duplicate_count").alias("max_duplicates"),
    )
    stats = []
    for row in grouped.collect():
        unique_events = int(row["unique_events"])
        duplicates = int(row["duplicate_deliveries"] or 0)
        deliveries = unique_events + duplicates
        stats.append(
            {
                "hour": _aware(row["hour"]),
                "topic": row["topic"],
                "consumer_group": row["consumer_group"],
                "deliveries": deliveries,
                "unique_events": unique_events,
                "duplicate_deliveries": duplicates,
                "duplicate_rate": duplicates / deliveries if deliveries else 0.0,
                "max_copies": 1 + int(row["max_duplicates"] or 0),
            }
        )
    return stats


def relay_stats(outbox: "DataFrame") -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    def count_where(condition: "Column") -> "Column":
        return F.sum(F.when(condition, 1).otherwise(0))

    grouped = outbox.groupBy("hour", "topic").agg(
        F.count(F.lit(1)).alias("events"),
        count_where(F.col("status") == "DONE").alias("published"),
        count_where(F.col("status") == "PENDING").alias("pending"),
        count_where(F.col("status") == "FAILED").alias("failed"),
        count_where(F.col("attempts") > 1).alias("retried"),
        F.max("attempts").alias("max_attempts"),
    )
    stats = []
    for row in grouped.collect():
        events = int(row["events"])
        stats.append(
            {
                "hour": _aware(row["hour"]),
                "topic": row["topic"],
                "events": events,
                "published": int(row["published"]),
                "pending": int(row["pending"]),
                "failed": int(row["failed"]),
                "retried": int(row["retried"]),
                "retry_rate": int(row["retried"]) / events,
                "failure_rate": int(row["failed"]) / events,
                "max_attempts": int(row["max_attempts"] or 0),
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
    frame: "DataFrame", kind: str, limit: int, detail: Any
) -> tuple[int, list[dict[str, Any]]]:
    # Counted and listed from one computation: the join behind a finding runs once.
    frame = frame.persist()
    total = frame.count()
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
    frame.unpersist()
    return total, rows


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
    outbox: "DataFrame",
    received: "DataFrame",
    config: JobConfig,
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Stuck and not-consumed events: what the outbox and inbox tables alone tell."""
    from pyspark.sql import functions as F

    sla_seconds = config.consume_sla.total_seconds()
    deadline = config.as_of - config.consume_sla
    counts: dict[str, int] = {}
    findings: list[dict[str, Any]] = []

    stuck = outbox.where(
        (F.col("status") == "PENDING") & (F.col("created_at") <= F.lit(deadline))
    ).withColumn("kafka_offsets", F.array().cast("array<bigint>"))
    counts["stuck"], rows = _finding_rows(
        stuck,
        "stuck",
        config.max_findings_per_kind,
        lambda v: (
            f"PENDING after {v['attempts']} attempt(s), created {v['created_at']:%Y-%m-%d %H:%M:%S}"
        ),
    )
    findings += rows

    pairs = [
        (r["topic"], r["event_type"])
        for r in outbox.select("topic", "event_type").distinct().collect()
    ]
    observed: dict[str, set[str]] = {}
    for row in received.select("topic", "consumer_group").distinct().collect():
        observed.setdefault(row["topic"], set()).add(row["consumer_group"])
    expected_rows = _expected_groups(
        pairs=pairs, observed=observed, configured=config.expected_consumers
    )
    expected = _local_frame(
        spark,
        [("topic", "string"), ("event_type", "string"), ("consumer_group", "string")],
        list(expected_rows),
    )
    due = outbox.where(
        (F.col("status") == "DONE")
        & F.col("published_at").isNotNull()
        & (F.col("published_at") <= F.lit(deadline))
    ).join(F.broadcast(expected), ["topic", "event_type"])
    recorded = received.select("event_id", "consumer_group", "received_at")
    not_consumed = (
        due.join(recorded, ["event_id", "consumer_group"], "left")
        .where(
            F.col("received_at").isNull()
            | (_seconds_between("received_at", "published_at") > sla_seconds)
        )
        .withColumn(
            "kafka_offsets",
            F.when(F.col("kafka_offset").isNull(), F.array().cast("array<bigint>")).otherwise(
                F.array("kafka_offset")
            ),
        )
    )
    counts["not_consumed"], rows = _finding_rows(
        not_consumed,
        "not_consumed",
        config.max_findings_per_kind,
        _not_consumed_detail(sla_seconds),
    )
    findings += rows
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
    """Asks the broker for each partition's watermarks: the scan reads from the window's
    first recorded offset (or the log start, if retention removed it) to the log end."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    bootstrap = config.kafka_config.get("bootstrap.servers", "")
    consumer = Consumer(
        {
            **config.kafka_config,
            "group.id": "analytics-reconciliation",
            "enable.auto.commit": False,
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
            if topic_metadata is None or topic_metadata.error is not None:
                # The topic is gone: each of its DONE events is missing from Kafka.
                partitions[topic] = {}
                continue
            partitions[topic] = {}
            for partition in sorted(topic_metadata.partitions):
                first = first_offsets.get((topic, partition))
                if first is None:
                    continue
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=config.kafka_timeout_seconds
                    )
                except KafkaException as error:
                    raise SourceUnreachable(
                        f"Kafka at {bootstrap} gave no offsets for {topic}[{partition}]: {error}"
                    ) from error
                partitions[topic][partition] = (low, max(first, low), high)
        return KafkaScanPlan(partitions=partitions)
    finally:
        consumer.close()


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
    for key, value in config.kafka_config.items():
        reader = reader.option(f"kafka.{key}", value)
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


def run_job(spark: "SparkSession", config: JobConfig) -> JobResult:
    from pyspark import StorageLevel

    clock = _PhaseClock()
    outbox = read_outbox(spark, config).persist(StorageLevel.MEMORY_AND_DISK)
    received = read_received(spark, config, outbox).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        result = JobResult()
        try:
            result.outbox_rows = outbox.count()
            result.inbox_rows = received.count()
        except Exception as error:
            raise SourceUnreachable(
                f"Could not read the database {config.source.database} at "
                f"{config.source.host}:{config.source.port}: {_java_message(error)}"
            ) from error
        clock.lap("read outbox and inbox, join")
        result.lag_stats = lag_stats(outbox, received, config.percentile_accuracy)
        clock.lap("lag percentiles")
        result.duplicate_stats = duplicate_stats(received)
        result.relay_stats = relay_stats(outbox)
        clock.lap("duplicates and relay")
        counts, result.findings = reconcile_database(spark, outbox, received, config)
        clock.lap("stuck and not consumed")
        if config.kafka_scan:
            kafka_counts, kafka_findings = reconcile_kafka(spark, outbox, config)
            result.kafka_records = kafka_counts.pop("kafka_records")
            counts.update(kafka_counts)
            result.findings += kafka_findings
            clock.lap("Kafka scan")
        result.summary = counts
        return result
    finally:
        outbox.unpersist()
        received.unpersist()


class _PhaseClock:
    """Logs how long each phase of the job took, for tuning."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        logger.info("analytics job: %s took %.1f s", phase, now - self.last)
        self.last = now
