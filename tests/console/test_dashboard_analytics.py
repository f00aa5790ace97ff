"""The dashboard's analytics card shows the run over the latest window, and how long ago that
window ended: a later re-run of an old window does not hide the recent one."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from analytics.models import AnalyticsRun

pytestmark = pytest.mark.django_db


def _run(*, window_end, started_at, marker: str) -> AnalyticsRun:
    return AnalyticsRun.objects.create(
        window_start=window_end - timedelta(hours=1),
        window_end=window_end,
        status=AnalyticsRun.Status.SUCCEEDED,
        started_at=started_at,
        finished_at=started_at + timedelta(seconds=30),
        summary={"marker": marker},
    )


def test_the_card_shows_the_latest_window_and_its_age(viewer):
    now = timezone.now()
    recent = _run(
        window_end=now - timedelta(minutes=10),
        started_at=now - timedelta(hours=1),
        marker="recent window",
    )
    # Started after it, over a window six years old.
    _run(window_end=now - timedelta(days=6 * 365), started_at=now, marker="old window")
    client = Client()
    client.force_login(viewer)
    html = client.get("/admin/").content.decode()
    assert "recent window" in html
    assert "old window" not in html
    assert '<span id="analytics-window-age">ended 10\xa0minutes ago</span>' in html

    summary = client.get("/api/stats/summary/").json()["analytics"]
    assert summary["summary"] == {"marker": "recent window"}
    assert summary["window_end"].startswith(recent.window_end.strftime("%Y-%m-%dT%H:%M:%S"))
    assert 599 <= summary["window_age_seconds"] <= 660
