import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from analytics.errors import InvalidWindow, RunNoLongerRunning
from analytics.jobs import JdbcSource, JobResult
from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from analytics.services import (
    _results_store,
    analytics_run_execute,
    analytics_runs_reap,
    analytics_window_default,
)
from analytics.tasks import reap_runs
from tests.outbox.conftest import subprocess_environment, wait_until

RESULT_MODELS = (DeliveryLagStat, DuplicateStat, RelayStat, ReconciliationFinding)
# A short beat for the test of a real job: a Spark job here takes some tenths of a second.
HEARTBEAT_SECONDS = 0.05


@pytest.mark.django_db
def test_an_empty_window_records_a_run_with_zero_rows(spark: Any, capsys: Any) -> None:
    call_command("analytics_run", "--since", "2001-01-01T00:00Z", "--until", "2001-01-01T01:00Z")
    run = AnalyticsRun.objects.get()
    assert run.status == AnalyticsRun.Status.SUCCEEDED, run.error
    assert (run.rows_read, run.outbox_rows, run.inbox_rows, run.kafka_records) == (0, 0, 0, 0)
    assert run.window_start == datetime(2001, 1, 1, tzinfo=UTC)
    assert run.trigger == AnalyticsRun.Trigger.COMMAND
    for model in RESULT_MODELS:
        assert not model.objects.exists()
    assert f"run {run.pk} SUCCEEDED" in capsys.readouterr().out


@pytest.mark.django_db
def test_an_unreachable_database_fails_the_run_with_no_partial_results(spark: Any) -> None:
    nowhere = JdbcSource(host="127.0.0.1", port=1, database="outbox", user="outbox", password="x")
    run = analytics_run_execute(
        since=datetime(2001, 1, 1, tzinfo=UTC),
        until=datetime(2001, 1, 2, tzinfo=UTC),
        spark=spark,
        source=nowhere,
    )
    assert run.status == AnalyticsRun.Status.FAILED
    assert "SourceUnreachable" in run.error
    assert "127.0.0.1:1" in run.error
    assert run.finished_at is not None
    assert run.duration_seconds is not None
    for model in RESULT_MODELS:
        assert not model.objects.exists()


@pytest.mark.django_db
def test_a_source_naming_several_servers_is_read_from_the_one_that_answers(spark: Any) -> None:
    # A DATABASES entry for failover (docs/integration.md): the first server is down, the
    # second is the test database; the driver reads from the one that is a primary.
    from django.db import connection

    database = connection.settings_dict
    failover = {
        **database,
        "HOST": f"127.0.0.1,{database['HOST']}",
        "PORT": f"1,{database['PORT']}",
    }
    source = JdbcSource.from_settings_dict(failover)
    assert source.url == (
        f"jdbc:postgresql://127.0.0.1:1,{database['HOST']}:{database['PORT']}/{database['NAME']}"
        "?targetServerType=primary"
    )
    run = analytics_run_execute(
        since=datetime(2001, 1, 1, tzinfo=UTC),
        until=datetime(2001, 1, 2, tzinfo=UTC),
        spark=spark,
        source=source,
    )
    assert run.status == AnalyticsRun.Status.SUCCEEDED, run.error


def test_a_source_with_as_many_ports_as_hosts_or_one_port_for_all() -> None:
    one_port = JdbcSource.from_settings_dict({"NAME": "d", "HOST": "a,b", "PORT": "5433"})
    assert one_port.url == "jdbc:postgresql://a:5433,b:5433/d?targetServerType=primary"
    single = JdbcSource.from_settings_dict({"NAME": "d", "HOST": "a", "PORT": ""})
    assert single.url == "jdbc:postgresql://a:5432/d"
    with pytest.raises(ValueError, match="3 hosts and 2 ports"):
        JdbcSource.from_settings_dict({"NAME": "d", "HOST": "a,b,c", "PORT": "1,2"})


@pytest.mark.django_db
def test_the_scheduled_task_runs_the_last_closed_interval(spark: Any) -> None:
    from analytics.tasks import run_analytics

    run_id = run_analytics.delay().get()
    run = AnalyticsRun.objects.get(pk=run_id)
    assert run.trigger == AnalyticsRun.Trigger.BEAT
    assert run.status == AnalyticsRun.Status.SUCCEEDED, run.error
    assert (run.window_start, run.window_end) == analytics_window_default(now=run.started_at)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("since", "until"),
    [
        (datetime(2001, 1, 2, tzinfo=UTC), datetime(2001, 1, 1, tzinfo=UTC)),
        (datetime(2001, 1, 1), datetime(2001, 1, 2)),
    ],
)
def test_a_bad_window_is_refused_before_any_run(since: datetime, until: datetime) -> None:
    with pytest.raises(InvalidWindow):
        analytics_run_execute(since=since, until=until)
    assert not AnalyticsRun.objects.exists()


@override_settings(ANALYTICS_INTERVAL_SECONDS=3600.0, ANALYTICS_CONSUME_SLA=timedelta(minutes=5))
@pytest.mark.parametrize(
    ("now", "window"),
    [
        ("2026-03-01T10:07:00+00:00", ("2026-03-01T09:00:00+00:00", "2026-03-01T10:00:00+00:00")),
        # The SLA of 09:59's events has not passed at 10:03: the window before is the last.
        ("2026-03-01T10:03:00+00:00", ("2026-03-01T08:00:00+00:00", "2026-03-01T09:00:00+00:00")),
    ],
)
def test_the_default_window_is_the_last_interval_the_sla_has_closed(
    now: str, window: tuple[str, str]
) -> None:
    since, until = analytics_window_default(now=datetime.fromisoformat(now))
    assert (since.isoformat(), until.isoformat()) == window


def running_run(
    *, started: timedelta, heartbeat: timedelta | None, worker: str = ""
) -> AnalyticsRun:
    """A RUNNING run started and last heard of (None: a run from before heartbeats) so long
    ago."""
    now = datetime.now(tz=UTC)
    return AnalyticsRun.objects.create(
        window_start=datetime(2001, 1, 1, tzinfo=UTC),
        window_end=datetime(2001, 1, 1, 1, tzinfo=UTC),
        started_at=now - started,
        heartbeat_at=now - heartbeat if heartbeat is not None else None,
        worker=worker,
    )


@pytest.mark.django_db
@override_settings(ANALYTICS_RUN_STALE_SECONDS=300.0)
def test_the_reaper_fails_the_runs_whose_worker_stopped_and_no_live_one() -> None:
    dead = running_run(started=timedelta(hours=1), heartbeat=timedelta(minutes=6), worker="w1:42")
    # Running for an hour, heard of 10 seconds ago: alive, however long it runs.
    live = running_run(started=timedelta(hours=1), heartbeat=timedelta(seconds=10))
    before_heartbeats = running_run(started=timedelta(hours=1), heartbeat=None)
    just_started = running_run(started=timedelta(minutes=1), heartbeat=None)
    finished = running_run(started=timedelta(hours=2), heartbeat=timedelta(hours=1))
    AnalyticsRun.objects.filter(pk=finished.pk).update(status=AnalyticsRun.Status.SUCCEEDED)

    assert reap_runs() == 2

    statuses = dict(AnalyticsRun.objects.values_list("pk", "status"))
    assert statuses == {
        dead.pk: "FAILED",
        live.pk: "RUNNING",
        before_heartbeats.pk: "FAILED",
        just_started.pk: "RUNNING",
        finished.pk: "SUCCEEDED",
    }
    dead.refresh_from_db()
    assert dead.error.startswith("the worker running it stopped: no heartbeat from w1:42 since ")
    assert dead.error.endswith("(more than 300 s); its results were not stored")
    assert dead.finished_at is not None
    assert reap_runs() == 0


@pytest.mark.django_db
def test_a_job_whose_run_was_reaped_stores_no_results_over_the_verdict() -> None:
    run = running_run(started=timedelta(hours=1), heartbeat=timedelta(hours=1))
    (reaped,) = analytics_runs_reap(stale_after=timedelta(minutes=5))
    result = JobResult(relay_stats=[])

    with pytest.raises(RunNoLongerRunning):
        _results_store(run=run, result=result, started=0.0)

    run.refresh_from_db()
    assert (run.status, run.error) == ("FAILED", reaped.error)


@pytest.mark.django_db(transaction=True)
@override_settings(ANALYTICS_RUN_HEARTBEAT_SECONDS=HEARTBEAT_SECONDS)
def test_a_running_job_names_its_worker_and_keeps_its_heartbeat_fresh(spark: Any) -> None:
    run = analytics_run_execute(
        since=datetime(2001, 1, 1, tzinfo=UTC),
        until=datetime(2001, 1, 1, 1, tzinfo=UTC),
        spark=spark,
    )

    assert run.status == AnalyticsRun.Status.SUCCEEDED, run.error
    assert run.worker == f"{socket.gethostname()}:{os.getpid()}"
    assert run.finished_at is not None
    assert run.heartbeat_at is not None
    # Beats came all along the job, written by its own thread while Spark worked: one at least
    # after the start's (a Spark job here takes some tenths of a second, several beats), and
    # the last one near the finish.
    assert run.heartbeat_at >= run.started_at + timedelta(seconds=HEARTBEAT_SECONDS)
    assert run.heartbeat_at > run.finished_at - timedelta(seconds=0.5)


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_worker_is_killed_is_reaped_and_not_before() -> None:
    job = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "analytics_run",
            "--since",
            "2001-01-01T00:00Z",
            "--until",
            "2001-01-01T01:00Z",
            "--no-kafka-scan",
        ],
        cwd=settings.BASE_DIR,
        env=subprocess_environment(
            ANALYTICS_RUN_HEARTBEAT_SECONDS="0.3", SPARK_MASTER="local[1]", SPARK_DRIVER_MEMORY="1g"
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its Spark JVM too, killed with it
    )
    try:
        wait_until(
            lambda: AnalyticsRun.objects.filter(status="RUNNING").exists(),
            timeout=120,
            message="the job's run",
        )
        time.sleep(2)
        # The job beats while it runs: a run heard of within the second is alive.
        assert analytics_runs_reap(stale_after=timedelta(seconds=1)) == []
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    time.sleep(1.5)

    (reaped,) = analytics_runs_reap(stale_after=timedelta(seconds=1))

    run = AnalyticsRun.objects.get()
    assert run.pk == reaped.pk
    assert run.status == AnalyticsRun.Status.FAILED
    assert run.worker == f"{socket.gethostname()}:{job.pid}"
    assert run.error.startswith(f"the worker running it stopped: no heartbeat from {run.worker}")
