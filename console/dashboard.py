"""Unfold's dashboard callback: what an on-call engineer needs on one page."""

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.http import HttpRequest

from analytics.models import AnalyticsRunPermission
from console.consumer_lag import console_consumer_groups, consumer_lag
from console.selectors import (
    analytics_dashboard,
    cached,
    console_summary,
    health_parts,
    latest_analytics,
    rate_series,
)
from outbox.models import OutboxEventPermission
from outbox.selectors import outbox_quarantined_keys

PUBLISHED_COLOUR = "var(--color-primary-600)"
CONSUMED_COLOUR = "#10b981"


def _chart(labels: list[str], published: list[int], consumed: list[int]) -> str:
    return json.dumps(
        {
            "labels": labels,
            "datasets": [
                {
                    "label": "Published (outbox)",
                    "data": published,
                    "borderColor": PUBLISHED_COLOUR,
                    "backgroundColor": PUBLISHED_COLOUR,
                    "displayYAxis": True,
                    "maxTicksXLimit": 12,
                },
                {
                    "label": "Consumed (inbox)",
                    "data": consumed,
                    "borderColor": CONSUMED_COLOUR,
                    "backgroundColor": CONSUMED_COLOUR,
                },
            ],
        }
    )


PERCENTILE_COLOURS = {"p50": "#10b981", "p95": "#f59e0b", "p99": "#dc2626"}
DUPLICATE_COLOUR = "var(--color-primary-600)"
LAG_STAGES = (
    ("publish", "Publish lag"),
    ("consume", "Consume lag"),
    ("end_to_end", "End-to-end lag"),
)


def _analytics_charts(results: dict[str, Any]) -> dict[str, Any]:
    """Line charts of the worst group's p50/p95/p99 per hour for each lag stage, and of the
    duplicate rate per hour; an hour without results is a gap, not a zero."""
    hours = []
    hour = results["since"]
    while hour < results["until"]:
        hours.append(hour)
        hour += timedelta(hours=1)
    labels = [h.strftime("%m-%d %H:00") for h in hours]
    lag = {(row["hour"], row["stage"]): row for row in results["lag"]}
    charts = []
    for stage, title in LAG_STAGES:
        datasets = []
        for index, name in enumerate(PERCENTILE_COLOURS):
            values = [lag.get((h, stage), {}).get(name) for h in hours]
            dataset: dict[str, Any] = {
                "label": name,
                "data": [None if v is None else round(v, 4) for v in values],
                "borderColor": PERCENTILE_COLOURS[name],
                "backgroundColor": PERCENTILE_COLOURS[name],
            }
            if index == 0:
                dataset.update({"displayYAxis": True, "suffixYAxis": "s", "maxTicksXLimit": 12})
            datasets.append(dataset)
        charts.append(
            {
                "stage": stage,
                "title": title,
                "data": json.dumps({"labels": labels, "datasets": datasets}),
                "empty": not any(key[1] == stage for key in lag),
            }
        )
    duplicates = {row["hour"]: row for row in results["duplicates"]}
    rate = [
        round(100 * duplicates[h]["duplicate_rate"], 4) if h in duplicates else None for h in hours
    ]
    duplicate_chart = json.dumps(
        {
            "labels": labels,
            "datasets": [
                {
                    "label": "Duplicate rate",
                    "data": rate,
                    "borderColor": DUPLICATE_COLOUR,
                    "backgroundColor": DUPLICATE_COLOUR,
                    "displayYAxis": True,
                    "suffixYAxis": "%",
                    "maxTicksXLimit": 12,
                }
            ],
        }
    )
    return {
        "lag_charts": charts,
        "duplicate_chart": duplicate_chart,
        "percentile_colours": PERCENTILE_COLOURS,
    }


def dashboard_callback(request: HttpRequest, context: dict[str, Any]) -> dict[str, Any]:
    with ThreadPoolExecutor(max_workers=1) as kafka_reader:
        # Kafka answers over the network while the database queries run; the lag read
        # touches no database, so the thread needs no connection of its own.
        lag_future = kafka_reader.submit(consumer_lag)
        summary = console_summary()
        hour = rate_series(period=timedelta(hours=1), bucket=timedelta(minutes=1))
        day = cached(
            "rates-day", lambda: rate_series(period=timedelta(days=1), bucket=timedelta(hours=1))
        )
        quarantined_keys = cached("quarantined-keys", lambda: outbox_quarantined_keys(limit=20))
        lag = lag_future.result()
    oldest = summary["outbox"]["oldest_pending_age_seconds"]
    context.update(
        {
            "console": summary,
            "oldest_pending_age": None if oldest is None else int(oldest),
            "chart_hour": _chart(hour.labels, hour.published, hour.consumed),
            "chart_day": _chart(day.labels, day.published, day.consumed),
            "published_last_hour": sum(hour.published),
            "consumed_last_hour": sum(hour.consumed),
            "quarantined_keys": quarantined_keys,
            "lag": lag,
            "lag_totals": lag.total_by_group(),
            "lag_groups": sorted(console_consumer_groups()),
            "health": health_parts(kafka=lag, oldest_pending_age=oldest),
            "analytics": latest_analytics(),
            "analytics_results": analytics_dashboard(),
            "analytics_charts": None,
            "can_run_analytics": request.user.has_perm(AnalyticsRunPermission.RUN),
            "can_release_keys": request.user.has_perm(OutboxEventPermission.RELEASE_KEY),
        }
    )
    if context["analytics_results"] is not None:
        context["analytics_charts"] = _analytics_charts(context["analytics_results"])
    return context
