"""The job on a planted history: lags against numpy, exact counts, and every planted problem
found with nothing else. The history and the run are made once for the module
(tests/analytics/conftest.py): delivery records and held events beside event rows the relay
never updates."""

import math
from typing import Any

import numpy as np
import pytest
from django.conf import settings
from django.db.models import Count

from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from tests.analytics.factories import CLAIM_RELAY_HANDED_OVER, History

pytestmark = [pytest.mark.django_db, pytest.mark.kafka]

PERCENTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def assert_within_rank_accuracy(value: float, data: list[float], q: float) -> None:
    """percentile_approx returns a value of the data whose rank is within n / accuracy of the
    exact one; numpy's inverted_cdf is the exact percentile of that definition."""
    ordered = np.sort(np.asarray(data))
    exact = float(np.percentile(ordered, q * 100, method="inverted_cdf"))
    exact_rank = int(np.searchsorted(ordered, exact, side="left"))
    tolerance = max(1, math.ceil(len(ordered) / settings.ANALYTICS_PERCENTILE_ACCURACY))
    nearby = ordered[max(0, exact_rank - tolerance) : exact_rank + tolerance + 1]
    assert np.isclose(nearby, value, rtol=0, atol=1e-6).any(), (value, exact, len(data))
    # numpy's default (linear interpolation) lies between two neighbours of that rank.
    linear = float(np.percentile(ordered, q * 100))
    low = ordered[max(0, exact_rank - tolerance - 1)]
    high = ordered[min(len(ordered) - 1, exact_rank + tolerance + 1)]
    assert abs(linear - value) <= high - low + 1e-6, (value, linear)


def test_run_succeeds_and_counts_the_rows_it_read(planted: tuple[History, AnalyticsRun]) -> None:
    history, run = planted
    run.refresh_from_db()
    assert run.status == AnalyticsRun.Status.SUCCEEDED, run.error
    assert run.outbox_rows == history.outbox_rows
    assert run.inbox_rows == history.inbox_rows
    assert run.kafka_records == history.kafka_records
    assert run.rows_read == history.outbox_rows + history.inbox_rows + history.kafka_records
    assert run.duration_seconds is not None
    assert run.duration_seconds > 0
    assert run.findings == len(history.findings)


def test_lag_percentiles_match_numpy_and_counts_are_exact(
    planted: tuple[History, AnalyticsRun],
) -> None:
    history, run = planted
    stats = {
        (s.hour, s.topic, s.event_type, s.consumer_group, s.stage): s
        for s in DeliveryLagStat.objects.filter(run=run)
    }
    assert set(stats) == set(history.lags)
    for key, lags in history.lags.items():
        stat = stats[key]
        assert stat.count == len(lags), key
        assert stat.max == pytest.approx(max(lags), abs=1e-6), key
        for name, q in PERCENTILES.items():
            assert_within_rank_accuracy(getattr(stat, name), lags, q)


def test_duplicate_statistics_are_exact(planted: tuple[History, AnalyticsRun]) -> None:
    history, run = planted
    stats = {(s.hour, s.topic, s.consumer_group): s for s in DuplicateStat.objects.filter(run=run)}
    assert set(stats) == set(history.duplicates)
    for key, (unique, duplicates, most) in history.duplicates.items():
        stat = stats[key]
        assert stat.unique_events == unique
        assert stat.duplicate_deliveries == duplicates
        assert stat.deliveries == unique + duplicates
        assert stat.duplicate_rate == pytest.approx(duplicates / (unique + duplicates))
        assert stat.max_copies == most


def test_relay_retries_and_failures_are_exact(planted: tuple[History, AnalyticsRun]) -> None:
    history, run = planted
    stats = {(s.hour, s.topic): s for s in RelayStat.objects.filter(run=run)}
    assert set(stats) == set(history.relay)
    for key, counts in history.relay.items():
        stat = stats[key]
        for name, value in counts.items():
            assert getattr(stat, name) == value, (key, name)
        assert stat.retry_rate == pytest.approx(counts["retried"] / counts["events"])
        assert stat.failure_rate == pytest.approx(counts["failed"] / counts["events"])


def test_reconciliation_finds_every_planted_problem_and_nothing_else(
    planted: tuple[History, AnalyticsRun],
) -> None:
    history, run = planted
    found = {
        (f.kind, f.event_id, f.consumer_group)
        for f in ReconciliationFinding.objects.filter(run=run)
    }
    assert found == history.findings
    kinds = {kind for kind, _, _ in history.findings}
    assert kinds == set(ReconciliationFinding.Kind.values)
    for kind in ReconciliationFinding.Kind.values:
        assert run.summary[kind] == sum(1 for k, _, _ in history.findings if k == kind)


def test_the_history_holds_every_kind_of_delivery_record(
    planted: tuple[History, AnalyticsRun],
) -> None:
    """The figures come from delivery records and held events of every kind: each outcome,
    a held head backing off and one whose attempts are spent, a replay, and the records
    migration 0012 wrote for what the claim relay delivered before its removal."""
    history, _ = planted
    rows = OutboxEvent.objects.filter(created_at__gte=history.since, created_at__lt=history.until)
    assert rows.count() == history.outbox_rows
    records = OutboxDelivery.objects.filter(event_id__in=rows.values("id"))
    assert set(records.values_list("outcome", flat=True)) == set(OutboxDelivery.Outcome.values)
    handed_over = records.filter(relay=CLAIM_RELAY_HANDED_OVER)
    assert handed_over.count() > history.outbox_rows / 10
    assert set(handed_over.values_list("outcome", flat=True)) == {"PUBLISHED"}
    assert OutboxHeldEvent.objects.filter(attempts__gt=0, next_attempt_at__isnull=True).exists()
    assert OutboxHeldEvent.objects.filter(next_attempt_at__isnull=False).exists()
    replayed = (
        OutboxDelivery.objects.filter(outcome=OutboxDelivery.Outcome.PUBLISHED)
        .values("event_id")
        .annotate(count=Count("id"))
        .filter(count=2)
    )
    assert replayed.exists()


def test_findings_tell_each_event_s_latest_publication_and_attempts(
    planted: tuple[History, AnalyticsRun],
) -> None:
    history, run = planted
    findings = list(ReconciliationFinding.objects.filter(run=run))
    assert findings
    for finding in findings:
        published_at, partition, offset = history.placements[finding.event_id]
        assert finding.published_at == published_at, finding.kind
        if finding.kind == "stuck":
            assert f"after {history.attempts[finding.event_id]} attempt(s)" in finding.detail
        elif finding.kind == "resent":
            assert f"the outbox recorded offset {offset}" in finding.detail
            assert offset in finding.kafka_offsets
        else:
            assert (finding.kafka_partition, finding.kafka_offsets) == (partition, [offset])


def test_a_resent_finding_names_every_offset(planted: tuple[History, AnalyticsRun]) -> None:
    _, run = planted
    resent = ReconciliationFinding.objects.filter(run=run, kind="resent")
    assert resent.exists()
    for finding in resent:
        assert len(finding.kafka_offsets) == 2
        assert finding.kafka_offsets == sorted(finding.kafka_offsets)
        assert "2 copies" in finding.detail


def test_rerunning_a_window_replaces_its_results(
    planted: tuple[History, AnalyticsRun], spark: Any
) -> None:
    from analytics.services import analytics_run_execute
    from tests.analytics.conftest import analytics_settings

    history, first = planted
    before = DeliveryLagStat.objects.filter(run=first).count()
    with analytics_settings(history):
        second = analytics_run_execute(
            since=history.since, until=history.until, spark=spark, kafka_scan=False
        )
    assert second.status == AnalyticsRun.Status.SUCCEEDED, second.error
    for model in (DeliveryLagStat, DuplicateStat, RelayStat, ReconciliationFinding):
        assert not model.objects.filter(run=first).exists(), model
    assert DeliveryLagStat.objects.filter(run=second).count() == before
    # Without the Kafka scan only the database findings remain.
    kinds = set(ReconciliationFinding.objects.filter(run=second).values_list("kind", flat=True))
    assert kinds == {"stuck", "not_consumed"}


def test_unreachable_broker_fails_the_run_and_keeps_the_previous_results(
    planted: tuple[History, AnalyticsRun], spark: Any
) -> None:
    from analytics.services import analytics_run_execute
    from tests.analytics.conftest import analytics_settings

    history, first = planted
    before = DeliveryLagStat.objects.filter(run=first).count()
    with analytics_settings(history):
        run = analytics_run_execute(
            since=history.since,
            until=history.until,
            spark=spark,
            kafka_config={"bootstrap.servers": "127.0.0.1:1"},
        )
    assert run.status == AnalyticsRun.Status.FAILED
    assert "Kafka at 127.0.0.1:1" in run.error
    assert run.finished_at is not None
    for model in (DeliveryLagStat, DuplicateStat, RelayStat, ReconciliationFinding):
        assert not model.objects.filter(run=run).exists(), model
    assert DeliveryLagStat.objects.filter(run=first).count() == before


def test_results_are_ready_for_the_console(planted: tuple[History, AnalyticsRun]) -> None:
    from analytics import selectors

    history, run = planted
    assert selectors.analytics_run_latest() == run
    series = list(selectors.delivery_lag_series(stage="end_to_end", topic=history.topics["orders"]))
    assert series
    assert all(s.stage == "end_to_end" for s in series)
    assert [s.hour for s in series] == sorted(s.hour for s in series)
    assert selectors.duplicate_rate_series(consumer_group="billing").count() == sum(
        1 for (_, _, group) in history.duplicates if group == "billing"
    )
    assert selectors.relay_stat_series().count() == len(history.relay)
    assert selectors.reconciliation_finding_list(kind="stuck").count() == 2
    assert selectors.reconciliation_finding_list().count() == len(history.findings)
