"""Reads of the analytics results, for the admin and the API.

Results of overlapping windows can cover the same hour: the series take, for each hour and
key, the row of the latest succeeded run.
"""

from datetime import datetime
from typing import TypeVar

from django.db.models import QuerySet

from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)

SUCCEEDED = AnalyticsRun.Status.SUCCEEDED
Hourly = TypeVar("Hourly", DeliveryLagStat, DuplicateStat, RelayStat)


def analytics_run_list(*, status: str | None = None) -> QuerySet[AnalyticsRun]:
    runs = AnalyticsRun.objects.order_by("-started_at")
    return runs.filter(status=status) if status else runs


def analytics_run_latest(*, status: str | None = SUCCEEDED) -> AnalyticsRun | None:
    return analytics_run_list(status=status).first()


def delivery_lag_series(
    *,
    stage: str = DeliveryLagStat.Stage.END_TO_END,
    since: datetime | None = None,
    until: datetime | None = None,
    topic: str | None = None,
    event_type: str | None = None,
    consumer_group: str | None = None,
) -> QuerySet[DeliveryLagStat]:
    """p50/p95/p99/max of one stage over time, by hour, topic, event type and group."""
    stats = DeliveryLagStat.objects.filter(run__status=SUCCEEDED, stage=stage)
    stats = _between(stats, since=since, until=until)
    if topic is not None:
        stats = stats.filter(topic=topic)
    if event_type is not None:
        stats = stats.filter(event_type=event_type)
    if consumer_group is not None:
        stats = stats.filter(consumer_group=consumer_group)
    key = ("hour", "topic", "event_type", "consumer_group", "stage")
    return stats.order_by(*key, "-run__started_at").distinct(*key)


def duplicate_rate_series(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    topic: str | None = None,
    consumer_group: str | None = None,
) -> QuerySet[DuplicateStat]:
    stats = _between(DuplicateStat.objects.filter(run__status=SUCCEEDED), since=since, until=until)
    if topic is not None:
        stats = stats.filter(topic=topic)
    if consumer_group is not None:
        stats = stats.filter(consumer_group=consumer_group)
    key = ("hour", "topic", "consumer_group")
    return stats.order_by(*key, "-run__started_at").distinct(*key)


def relay_stat_series(
    *, since: datetime | None = None, until: datetime | None = None, topic: str | None = None
) -> QuerySet[RelayStat]:
    stats = _between(RelayStat.objects.filter(run__status=SUCCEEDED), since=since, until=until)
    if topic is not None:
        stats = stats.filter(topic=topic)
    key = ("hour", "topic")
    return stats.order_by(*key, "-run__started_at").distinct(*key)


def reconciliation_finding_list(
    *, run: AnalyticsRun | None = None, kind: str | None = None
) -> QuerySet[ReconciliationFinding]:
    """The findings of `run`, by default of the latest succeeded run."""
    run = run or analytics_run_latest()
    if run is None:
        return ReconciliationFinding.objects.none()
    findings = ReconciliationFinding.objects.filter(run=run)
    if kind is not None:
        findings = findings.filter(kind=kind)
    return findings.order_by("kind", "created_at", "event_id")


def _between(
    stats: QuerySet[Hourly], *, since: datetime | None, until: datetime | None
) -> QuerySet[Hourly]:
    if since is not None:
        stats = stats.filter(hour__gte=since)
    if until is not None:
        stats = stats.filter(hour__lt=until)
    return stats
