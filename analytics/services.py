"""Writes of the analytics app: running the job for a window and storing its results."""

import logging
import time
import zlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

from analytics.errors import InvalidWindow
from analytics.jobs import JdbcSource, JobConfig, JobResult, run_job
from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from kafka_events.kafka import kafka_connection_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

RESULT_MODELS = (DeliveryLagStat, DuplicateStat, RelayStat, ReconciliationFinding)
# pg_advisory_xact_lock's first key: this app's namespace; the second is the window's hash.
ADVISORY_LOCK_NAMESPACE = 0x414E41  # "ANA"
BULK_BATCH_SIZE = 1000


def analytics_window_default(*, now: datetime | None = None) -> tuple[datetime, datetime]:
    """The last full interval (ANALYTICS_INTERVAL_SECONDS, aligned to the epoch) that ended
    at least ANALYTICS_CONSUME_SLA ago, so its events have had their chance to be consumed."""
    interval = int(settings.ANALYTICS_INTERVAL_SECONDS)
    closed = (now or timezone.now()) - settings.ANALYTICS_CONSUME_SLA
    until_epoch = int(closed.timestamp()) // interval * interval
    until = datetime.fromtimestamp(until_epoch, tz=UTC)
    return until - timedelta(seconds=interval), until


def analytics_job_config(
    *,
    since: datetime,
    until: datetime,
    as_of: datetime,
    source: JdbcSource | None = None,
    kafka_config: dict[str, str] | None = None,
    kafka_scan: bool | None = None,
) -> JobConfig:
    """The job's configuration from the settings; `source` defaults to the database that
    ANALYTICS_SOURCE_DATABASE names (under pytest, its test database)."""
    if source is None:
        source = JdbcSource.from_settings_dict(
            connections[settings.ANALYTICS_SOURCE_DATABASE].settings_dict
        )
    return JobConfig(
        since=since,
        until=until,
        as_of=as_of,
        source=source,
        consume_sla=settings.ANALYTICS_CONSUME_SLA,
        expected_consumers=settings.ANALYTICS_EXPECTED_CONSUMERS,
        jdbc_partitions=settings.ANALYTICS_JDBC_PARTITIONS,
        jdbc_fetch_size=settings.ANALYTICS_JDBC_FETCH_SIZE,
        percentile_accuracy=settings.ANALYTICS_PERCENTILE_ACCURACY,
        kafka_scan=settings.ANALYTICS_KAFKA_SCAN if kafka_scan is None else kafka_scan,
        kafka_config={
            str(k): str(v) for k, v in (kafka_config or kafka_connection_config()).items()
        },
        kafka_timeout_seconds=settings.ANALYTICS_KAFKA_TIMEOUT_SECONDS,
        max_findings_per_kind=settings.ANALYTICS_MAX_FINDINGS_PER_KIND,
    )


def analytics_run_execute(
    *,
    since: datetime,
    until: datetime,
    trigger: str = AnalyticsRun.Trigger.COMMAND,
    spark: "SparkSession | None" = None,
    source: JdbcSource | None = None,
    kafka_config: dict[str, str] | None = None,
    kafka_scan: bool | None = None,
) -> AnalyticsRun:
    """Runs the job on the outbox events created in [since, until) and stores its results,
    replacing those of earlier runs of the same window. A job that fails (an unreachable
    database or broker, among others) leaves a FAILED run with the reason, and no results.

    Call outside a transaction: the run is visible as RUNNING while Spark works.
    """
    analytics_window_check(since=since, until=until)
    started = time.monotonic()
    run = AnalyticsRun.objects.create(
        window_start=since,
        window_end=until,
        trigger=trigger,
        spark_master=settings.SPARK_MASTER,
    )
    try:
        if spark is None:
            from analytics.spark import spark_session_get

            spark = spark_session_get()
        run.spark_master = str(spark.sparkContext.master)
        config = analytics_job_config(
            since=since,
            until=until,
            as_of=run.started_at,
            source=source,
            kafka_config=kafka_config,
            kafka_scan=kafka_scan,
        )
        result = run_job(spark, config)
        _results_store(run=run, result=result, started=started)
    except Exception as error:
        logger.exception("analytics run %s failed", run.pk)
        run.status = AnalyticsRun.Status.FAILED
        run.error = f"{type(error).__name__}: {error}"
        run.finished_at = timezone.now()
        run.duration_seconds = time.monotonic() - started
        run.save()
    return run


def analytics_run_scheduled(
    *,
    trigger: str = AnalyticsRun.Trigger.BEAT,
    since: datetime | None = None,
    until: datetime | None = None,
) -> AnalyticsRun:
    """Runs the given window, by default the last one the SLA has closed."""
    if since is None or until is None:
        since, until = analytics_window_default()
    return analytics_run_execute(since=since, until=until, trigger=trigger)


def analytics_window_check(*, since: datetime, until: datetime) -> None:
    if since.tzinfo is None or until.tzinfo is None:
        raise InvalidWindow("The window's bounds need a time zone (e.g. 2026-01-01T00:00Z).")
    if since >= until:
        raise InvalidWindow(f"The window is empty: since ({since}) is not before until ({until}).")


def analytics_run_queue(
    *, trigger: str, since: datetime | None = None, until: datetime | None = None
) -> tuple[datetime, datetime]:
    """Queues the Celery task on [since, until) once the caller's transaction commits, and
    returns the window. Without one, the last window the SLA has closed (the beat's)."""
    from analytics.tasks import run_analytics

    if (since is None) != (until is None):
        raise InvalidWindow("Give both since and until, or neither for the last closed window.")
    if since is None or until is None:
        since, until = analytics_window_default()
    analytics_window_check(since=since, until=until)
    window = (since.isoformat(), until.isoformat())
    transaction.on_commit(
        lambda: run_analytics.delay(trigger=trigger, since=window[0], until=window[1])
    )
    return since, until


def _window_lock_key(run: AnalyticsRun) -> int:
    window = f"{run.window_start.isoformat()}/{run.window_end.isoformat()}"
    # pg_advisory_xact_lock(int, int): a signed 32-bit key.
    return zlib.crc32(window.encode()) - 2**31


def _results_store(*, run: AnalyticsRun, result: JobResult, started: float) -> None:
    """Replaces the window's results in one transaction: readers see the old or the new."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Two runs of one window store one after the other, never interleaved.
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)",
                [ADVISORY_LOCK_NAMESPACE, _window_lock_key(run)],
            )
        for model in RESULT_MODELS:
            model.objects.filter(
                run__window_start=run.window_start, run__window_end=run.window_end
            ).exclude(run=run).delete()
        _bulk(DeliveryLagStat, run, result.lag_stats)
        _bulk(DuplicateStat, run, result.duplicate_stats)
        _bulk(RelayStat, run, result.relay_stats)
        _bulk(ReconciliationFinding, run, result.findings)
        run.status = AnalyticsRun.Status.SUCCEEDED
        run.outbox_rows = result.outbox_rows
        run.inbox_rows = result.inbox_rows
        run.kafka_records = result.kafka_records
        run.rows_read = result.rows_read
        run.findings = sum(
            result.summary.get(kind, 0) for kind in ReconciliationFinding.Kind.values
        )
        run.summary = {
            **result.summary,
            "lag_stats": len(result.lag_stats),
            "duplicate_stats": len(result.duplicate_stats),
            "relay_stats": len(result.relay_stats),
        }
        run.finished_at = timezone.now()
        run.duration_seconds = time.monotonic() - started
        run.save()


def _bulk(model: Any, run: AnalyticsRun, rows: list[dict[str, Any]]) -> None:
    model.objects.bulk_create((model(run=run, **row) for row in rows), batch_size=BULK_BATCH_SIZE)
