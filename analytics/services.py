"""Writes of the analytics app: running the job for a window and storing its results."""

import logging
import os
import socket
import threading
import time
import zlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from analytics.errors import InvalidWindow, RunNoLongerRunning
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
# What a finished job writes of its run.
RESULT_FIELDS = (
    "status",
    "spark_master",
    "outbox_rows",
    "inbox_rows",
    "kafka_records",
    "rows_read",
    "findings",
    "summary",
    "finished_at",
    "duration_seconds",
)


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
        worker=f"{socket.gethostname()}:{os.getpid()}",
        heartbeat_at=Now(),
    )
    run.refresh_from_db(fields=["heartbeat_at"])
    try:
        with RunHeartbeat(run_id=run.pk, interval=settings.ANALYTICS_RUN_HEARTBEAT_SECONDS):
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
        # Unless the reaper marked it FAILED already: its reason stands.
        AnalyticsRun.objects.filter(pk=run.pk, status=AnalyticsRun.Status.RUNNING).update(
            status=AnalyticsRun.Status.FAILED,
            spark_master=run.spark_master,
            error=f"{type(error).__name__}: {error}",
            finished_at=timezone.now(),
            duration_seconds=time.monotonic() - started,
        )
    run.refresh_from_db()
    return run


class RunHeartbeat:
    """Writes a run's heartbeat every `interval` seconds while the job runs, from a thread of
    its own with a database connection of its own: the job's Spark calls hold the main thread
    for minutes. A heartbeat the database does not take is logged and tried at the next beat;
    the run is reaped only after ANALYTICS_RUN_STALE_SECONDS without one."""

    def __init__(self, *, run_id: int, interval: float) -> None:
        self.run_id = run_id
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self._beat, name=f"analytics-run-{run_id}-heartbeat", daemon=True
        )

    def __enter__(self) -> "RunHeartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.thread.join()

    def _beat(self) -> None:
        try:
            while not self.stopped.wait(self.interval):
                try:
                    AnalyticsRun.objects.filter(
                        pk=self.run_id, status=AnalyticsRun.Status.RUNNING
                    ).update(heartbeat_at=Now())
                except DatabaseError as error:
                    logger.warning(
                        "analytics run %s: heartbeat not written: %s", self.run_id, error
                    )
                    connection.close()  # the next beat connects afresh
        finally:
            connection.close()


def analytics_runs_reap(*, stale_after: timedelta) -> list[AnalyticsRun]:
    """Marks FAILED the RUNNING runs whose worker stopped: no heartbeat (or, for a run older
    than heartbeats, no start) for `stale_after`, by the database's clock. Returns them."""
    cutoff = ExpressionWrapper(Now() - Value(stale_after), output_field=DateTimeField())
    reaped: list[AnalyticsRun] = []
    with transaction.atomic():
        # A job storing its results holds its run's row: it is not stale, and is skipped.
        stale = (
            AnalyticsRun.objects.select_for_update(skip_locked=True)
            .filter(status=AnalyticsRun.Status.RUNNING)
            .annotate(last_sign=Coalesce("heartbeat_at", "started_at"))
            .filter(last_sign__lt=cutoff)
            .order_by("pk")
        )
        for run in stale:
            run.status = AnalyticsRun.Status.FAILED
            run.error = (
                f"the worker running it stopped: no heartbeat from "
                f"{run.worker or 'its worker'} since {run.last_sign:%Y-%m-%d %H:%M:%S} UTC "
                f"(more than {stale_after.total_seconds():g} s); its results were not stored"
            )
            run.finished_at = timezone.now()
            run.save(update_fields=["status", "error", "finished_at"])
            logger.warning("analytics run %s: %s", run.pk, run.error)
            reaped.append(run)
    return reaped


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
        # The run's row, locked until the results are in: the reaper cannot mark it FAILED
        # meanwhile, nor can results be stored over its verdict.
        status = (
            AnalyticsRun.objects.select_for_update()
            .filter(pk=run.pk)
            .values_list("status", flat=True)
            .first()
        )
        if status != AnalyticsRun.Status.RUNNING:
            raise RunNoLongerRunning(
                f"the run was marked {status} while its job ran; its results are not stored"
            )
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
        # Not the heartbeat, which its thread writes.
        run.save(update_fields=RESULT_FIELDS)


def _bulk(model: Any, run: AnalyticsRun, rows: list[dict[str, Any]]) -> None:
    model.objects.bulk_create((model(run=run, **row) for row in rows), batch_size=BULK_BATCH_SIZE)
