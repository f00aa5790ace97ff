"""Unfold's dashboard callback: what an on-call engineer needs on one page."""

import json
from datetime import timedelta
from typing import Any

from django.http import HttpRequest

from outbox.selectors import outbox_quarantined_keys
from project.selectors import (
    cached,
    console_consumer_groups,
    console_summary,
    consumer_lag,
    health_parts,
    latest_analytics,
    rate_series,
)

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


def dashboard_callback(request: HttpRequest, context: dict[str, Any]) -> dict[str, Any]:
    summary = console_summary()
    hour = rate_series(period=timedelta(hours=1), bucket=timedelta(minutes=1))
    day = cached(
        "rates-day", lambda: rate_series(period=timedelta(days=1), bucket=timedelta(hours=1))
    )
    lag = consumer_lag()
    oldest = summary["outbox"]["oldest_pending_age_seconds"]
    context.update(
        {
            "console": summary,
            "oldest_pending_age": None if oldest is None else int(oldest),
            "chart_hour": _chart(hour.labels, hour.published, hour.consumed),
            "chart_day": _chart(day.labels, day.published, day.consumed),
            "published_last_hour": sum(hour.published),
            "consumed_last_hour": sum(hour.consumed),
            "quarantined_keys": cached(
                "quarantined-keys", lambda: outbox_quarantined_keys(limit=20)
            ),
            "lag": lag,
            "lag_totals": lag.total_by_group(),
            "lag_groups": sorted(console_consumer_groups()),
            "health": health_parts(kafka=lag, oldest_pending_age=oldest),
            "analytics": latest_analytics(),
            "can_release_keys": request.user.has_perm("outbox.release_outboxkey"),
        }
    )
    return context
