"""Reads of the analytics results, for the admin and the API.

Results of overlapping windows can cover the same hour: the series take, for each hour and
key, the row of the latest succeeded run whose window covers the whole hour, and the row of a
run over part of the hour (an ad-hoc `--since 10:30`) only where no whole-hour run has one.
"""

from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db.models import BooleanField, ExpressionWrapper, F, Max, Q, QuerySet, Sum

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


def analytics_run_latest_window() -> AnalyticsRun | None:
    """The succeeded run whose window ends last: what is known of the most recent traffic. A
    run started later over an older window (a re-run of last year) does not hide it."""
    runs = AnalyticsRun.objects.filter(status=SUCCEEDED)
    return runs.order_by("-window_end", "-finished_at").first()


def delivery_lag_series(
    *,
    stage: str | None = DeliveryLagStat.Stage.END_TO_END,
    since: datetime | None = None,
    until: datetime | None = None,
    topic: str | None = None,
    event_type: str | None = None,
    consumer_group: str | None = None,
) -> QuerySet[DeliveryLagStat]:
    """p50/p95/p99/max of one stage (None: every stage) over time, by hour, topic, event type
    and group."""
    stats = DeliveryLagStat.objects.filter(run__status=SUCCEEDED)
    if stage is not None:
        stats = stats.filter(stage=stage)
    stats = _between(stats, since=since, until=until)
    if topic is not None:
        stats = stats.filter(topic=topic)
    if event_type is not None:
        stats = stats.filter(event_type=event_type)
    if consumer_group is not None:
        stats = stats.filter(consumer_group=consumer_group)
    return _latest_per_key(stats, ("hour", "topic", "event_type", "consumer_group", "stage"))


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
    return _latest_per_key(stats, ("hour", "topic", "consumer_group"))


def relay_stat_series(
    *, since: datetime | None = None, until: datetime | None = None, topic: str | None = None
) -> QuerySet[RelayStat]:
    stats = _between(RelayStat.objects.filter(run__status=SUCCEEDED), since=since, until=until)
    if topic is not None:
        stats = stats.filter(topic=topic)
    return _latest_per_key(stats, ("hour", "topic"))


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


def reconciliation_finding_all() -> QuerySet[ReconciliationFinding]:
    """The findings of every succeeded run (a re-run of a window has replaced the earlier
    run's), for lists that filter by run, kind or event id."""
    return ReconciliationFinding.objects.filter(run__status=SUCCEEDED)


def analytics_latest_hour() -> datetime | None:
    """The newest hour that a succeeded run has lag statistics for."""
    last: datetime | None = DeliveryLagStat.objects.filter(run__status=SUCCEEDED).aggregate(
        last=Max("hour")
    )["last"]
    return last


def delivery_lag_hourly(*, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """For each hour and stage, the highest p50, p95, p99 and max among its topics, event
    types and consumer groups (the worst group: group percentiles do not add up to an
    overall one), from the latest run covering each hour."""
    latest = delivery_lag_series(stage=None, since=since, until=until)
    rows = (
        DeliveryLagStat.objects.filter(pk__in=latest.values("pk"))
        .values("hour", "stage")
        .annotate(p50=Max("p50"), p95=Max("p95"), p99=Max("p99"), max=Max("max"))
        .order_by("hour", "stage")
    )
    return [dict(row) for row in rows]


def duplicate_rate_hourly(*, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """For each hour, duplicate deliveries over deliveries across every topic and group."""
    latest = duplicate_rate_series(since=since, until=until)
    rows = (
        DuplicateStat.objects.filter(pk__in=latest.values("pk"))
        .values("hour")
        .annotate(deliveries=Sum("deliveries"), duplicates=Sum("duplicate_deliveries"))
        .order_by("hour")
    )
    return [
        {
            **row,
            "duplicate_rate": row["duplicates"] / row["deliveries"] if row["deliveries"] else 0.0,
        }
        for row in rows
    ]


def analytics_hours(*, hours: int) -> tuple[datetime, datetime] | None:
    """The last `hours` hours that have results, as [since, until)."""
    last = analytics_latest_hour()
    if last is None:
        return None
    until = last + timedelta(hours=1)
    return until - timedelta(hours=hours), until


def _between(
    stats: QuerySet[Hourly], *, since: datetime | None, until: datetime | None
) -> QuerySet[Hourly]:
    if since is not None:
        stats = stats.filter(hour__gte=since)
    if until is not None:
        stats = stats.filter(hour__lt=until)
    return stats


def _latest_per_key(stats: QuerySet[Hourly], key: tuple[str, ...]) -> QuerySet[Hourly]:
    whole_hour = ExpressionWrapper(
        Q(run__window_start__lte=F("hour"), run__window_end__gte=F("hour") + timedelta(hours=1)),
        output_field=BooleanField(),
    )
    return (
        stats.annotate(whole_hour=whole_hour)
        .order_by(*key, F("whole_hour").desc(), "-run__started_at")
        .distinct(*key)
    )
