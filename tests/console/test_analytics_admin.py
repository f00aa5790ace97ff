"""The analytics part of the admin with Django's test client: the dashboard's charts carry
the results' figures, the latest findings link to their outbox events, and the "run
analytics" button confirms, then queues an audited run, for users with its permission."""

import html
import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from analytics.models import AnalyticsRun
from analytics.services import analytics_runs_reap
from console.models import OperatorAction
from tests.analytics.results import result_run

pytestmark = pytest.mark.django_db

RUN_NOW = "/admin/analytics/analyticsrun/run_now/"


def logged_in(*permissions: str) -> Client:
    user = User.objects.create_user(username=f"user-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.user_permissions.set(
        [
            Permission.objects.get(content_type__app_label=app, codename=codename)
            for app, codename in (name.split(".") for name in permissions)
        ]
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def _kafka_unreachable(settings: Any) -> None:
    # The dashboard's Kafka card is not under test here: it answers fast as "unreachable".
    settings.KAFKA_EVENTS = {**settings.KAFKA_EVENTS, "BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    settings.CONSOLE_KAFKA_TIMEOUT_SECONDS = 0.5
    settings.CONSOLE_DASHBOARD_CACHE_SECONDS = 0


def charts(page: str) -> dict[str, dict[str, Any]]:
    """The chart components' data by their class (analytics-lag-<stage>, analytics-duplicates)."""
    found = {}
    for match in re.finditer(
        r'<div class="relative w-full ([\w-]+)">\s*<canvas class="chart"[^>]*data-value="([^"]*)"',
        page,
    ):
        found[match.group(1)] = json.loads(html.unescape(match.group(2)))
    return found


def test_the_dashboard_charts_lag_percentiles_and_the_duplicate_rate_per_hour() -> None:
    result_run(hours=3)
    page = logged_in("analytics.view_analyticsrun").get("/admin/").content.decode()
    found = charts(page)
    assert set(found) == {
        "analytics-lag-publish",
        "analytics-lag-consume",
        "analytics-lag-end_to_end",
        "analytics-duplicates",
    }
    consume = found["analytics-lag-consume"]
    # 48 hourly points ending with the newest hour of results.
    assert len(consume["labels"]) == 48
    assert consume["labels"][-3:] == ["03-01 00:00", "03-01 01:00", "03-01 02:00"]
    by_label = {dataset["label"]: dataset["data"] for dataset in consume["datasets"]}
    # The worst group per hour: the users topic, twice as slow (p50 = 2 x (hour + 1)).
    assert by_label["p50"][-3:] == [2.0, 4.0, 6.0]
    assert by_label["p95"][-3:] == [4.0, 8.0, 12.0]
    assert by_label["p99"][-3:] == [6.0, 12.0, 18.0]
    assert by_label["p50"][0] is None  # an hour without results is a gap
    duplicates = found["analytics-duplicates"]["datasets"][0]["data"]
    # (1 + 3 + 1 + 3) duplicates of 400 deliveries per hour.
    assert duplicates[-3:] == [2.0, 2.0, 2.0]
    assert "https://" not in "".join(
        line for line in page.splitlines() if "<script" in line or "<link" in line
    )


def test_the_dashboard_charts_the_latest_run_of_an_hour() -> None:
    result_run(hours=1)
    result_run(hours=1, scale=10)
    page = logged_in("analytics.view_analyticsrun").get("/admin/").content.decode()
    publish = charts(page)["analytics-lag-publish"]
    assert publish["datasets"][0]["data"][-1] == 20.0


def test_the_dashboard_lists_the_latest_findings_linked_to_their_events() -> None:
    result_run(since=result_run().window_end)
    latest = AnalyticsRun.objects.order_by("-started_at").first()
    assert latest is not None
    page = logged_in("analytics.view_analyticsrun").get("/admin/").content.decode()
    assert 'id="analytics-findings"' in page
    for finding in latest.findings_set.all():
        assert f'href="/admin/outbox/outboxevent/{finding.event_id}/change/"' in page
    older = AnalyticsRun.objects.exclude(pk=latest.pk).get()
    for finding in older.findings_set.all():
        assert finding.event_id not in page


def test_the_dashboard_without_results_says_so() -> None:
    page = logged_in("analytics.view_analyticsrun").get("/admin/").content.decode()
    assert "No analytics results yet" in page
    assert "analytics-lag-" not in page


def test_the_run_button_is_shown_to_users_with_the_run_permission() -> None:
    result_run()
    viewer = logged_in("analytics.view_analyticsrun").get("/admin/").content.decode()
    assert 'id="run-analytics"' not in viewer
    runner = logged_in("analytics.view_analyticsrun", "analytics.run_analytics")
    page = runner.get("/admin/").content.decode()
    assert re.search(rf'<a id="run-analytics" [^>]*href="{RUN_NOW}"', page)


def test_the_run_button_confirms_then_queues_an_audited_run(
    django_capture_on_commit_callbacks: Any,
) -> None:
    client = logged_in("analytics.view_analyticsrun", "analytics.run_analytics")
    with mock.patch("analytics.tasks.run_analytics.delay") as delay:
        confirm = client.get(RUN_NOW)
        assert confirm.status_code == 200
        assert 'id="run-analytics-confirm"' in confirm.content.decode()
        assert not delay.called  # a GET changes nothing
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(RUN_NOW, {"note": "after the outage"})
    assert response.status_code == 302
    assert delay.call_args.kwargs["trigger"] == "admin"
    record = OperatorAction.objects.get()
    assert (record.action, record.source, record.note) == (
        "analytics.run",
        "admin",
        "after the outage",
    )


def test_the_run_button_needs_the_run_permission() -> None:
    client = logged_in("analytics.view_analyticsrun")
    with mock.patch("analytics.tasks.run_analytics.delay") as delay:
        assert client.get(RUN_NOW).status_code == 403
        assert client.post(RUN_NOW).status_code == 403
    assert not delay.called
    assert not OperatorAction.objects.exists()


def test_a_run_whose_worker_stopped_shows_failed_with_the_reaper_s_reason() -> None:
    now = datetime.now(tz=UTC)
    run = AnalyticsRun.objects.create(
        window_start=datetime(2026, 3, 1, tzinfo=UTC),
        window_end=datetime(2026, 3, 1, 1, tzinfo=UTC),
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(minutes=30),
        worker="analytics-host:4242",
    )
    (reaped,) = analytics_runs_reap(stale_after=timedelta(minutes=5))
    client = logged_in("analytics.view_analyticsrun")

    listing = client.get("/admin/analytics/analyticsrun/")
    detail = client.get(f"/admin/analytics/analyticsrun/{run.pk}/change/")

    assert (listing.status_code, detail.status_code) == (200, 200)
    (row,) = re.findall(
        r"<tr[^>]*>(?:(?!</tr>).)*field-error_line(?:(?!</tr>).)*</tr>",
        listing.content.decode(),
        re.S,
    )
    cells = [html.unescape(cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert "Failed" in cells
    assert cells[-1].startswith(
        "the worker running it stopped: no heartbeat from analytics-host:4242 since "
    )
    page = html.unescape(detail.content.decode())
    assert reaped.error in page
    assert "analytics-host:4242" in page
