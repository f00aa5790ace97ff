from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from analytics.errors import InvalidWindow
from analytics.jobs import JdbcSource
from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from analytics.services import analytics_run_execute, analytics_window_default

RESULT_MODELS = (DeliveryLagStat, DuplicateStat, RelayStat, ReconciliationFinding)


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
