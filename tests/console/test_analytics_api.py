"""/api/analytics/: authentication, a permission per endpoint and for starting a run, the
filters, bad input refused with a clear message, and the audited, queued start."""

import json
import uuid
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from analytics.models import AnalyticsRun, ReconciliationFinding
from console.models import OperatorAction
from tests.analytics.results import RESULTS_START, finding_create, result_run

pytestmark = pytest.mark.django_db

API = "/api/analytics/"
READ_PERMISSIONS = (
    "analytics.view_analyticsrun",
    "analytics.view_deliverylagstat",
    "analytics.view_duplicatestat",
    "analytics.view_relaystat",
    "analytics.view_reconciliationfinding",
)
LISTS = {
    "runs/": "analytics.view_analyticsrun",
    "lag-stats/": "analytics.view_deliverylagstat",
    "duplicate-stats/": "analytics.view_duplicatestat",
    "relay-stats/": "analytics.view_relaystat",
    "findings/": "analytics.view_reconciliationfinding",
}


def client_with(*permissions: str) -> APIClient:
    user = User.objects.create_user(username=f"user-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.user_permissions.set(
        [
            Permission.objects.get(content_type__app_label=app, codename=codename)
            for app, codename in (name.split(".") for name in permissions)
        ]
    )
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    return client


@pytest.fixture
def reader() -> APIClient:
    return client_with(*READ_PERMISSIONS)


def results(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


@pytest.mark.parametrize("path", [*LISTS, "runs/start/"])
def test_anonymous_requests_are_refused(path: str) -> None:
    client = APIClient()
    response = (
        client.post(f"{API}{path}", {}) if path.endswith("start/") else client.get(f"{API}{path}")
    )
    assert response.status_code in (401, 403)
    assert response.json()["code"] in ("not_authenticated", "authentication_failed")


@pytest.mark.parametrize(("path", "permission"), LISTS.items())
def test_each_list_needs_its_view_permission(path: str, permission: str) -> None:
    result_run()
    others = [name for name in READ_PERMISSIONS if name != permission]
    assert client_with(*others).get(f"{API}{path}").status_code == 403
    assert results(client_with(permission).get(f"{API}{path}"))


def test_runs_list_and_detail(reader: APIClient) -> None:
    run = result_run()
    failed = result_run(status=AnalyticsRun.Status.FAILED, since=RESULTS_START + timedelta(days=1))
    rows = results(reader.get(f"{API}runs/"))
    assert [row["id"] for row in rows] == [failed.pk, run.pk]
    assert [row["id"] for row in results(reader.get(f"{API}runs/", {"status": "SUCCEEDED"}))] == [
        run.pk
    ]
    detail = reader.get(f"{API}runs/{run.pk}/").json()
    assert detail["summary"] == {"stuck": 1, "not_consumed": 1}
    assert detail["window_start"].startswith("2026-03-01T00:00:00")
    assert reader.get(f"{API}runs/abc/").json()["code"] == "invalid_id"
    assert reader.get(f"{API}runs/999999/").status_code == 404


def test_lag_stats_filter_by_hour_range_topic_event_type_group_and_stage(
    reader: APIClient,
) -> None:
    result_run(hours=3)
    everything = results(reader.get(f"{API}lag-stats/", {"page_size": 500}))
    assert len(everything) == 3 * 2 * (1 + 2 + 2)
    rows = results(
        reader.get(
            f"{API}lag-stats/",
            {
                "hour_after": "2026-03-01T01:00:00Z",
                "hour_before": "2026-03-01T02:00:00Z",
                "topic": "users",
                "event_type": "users.created",
                "consumer_group": "billing",
                "stage": "consume",
            },
        )
    )
    assert len(rows) == 1
    assert rows[0]["hour"].startswith("2026-03-01T01:00:00")
    assert (rows[0]["p50"], rows[0]["p95"], rows[0]["p99"]) == (4.0, 8.0, 12.0)


def test_lag_stats_serve_the_latest_run_of_an_hour_unless_a_run_is_named(
    reader: APIClient,
) -> None:
    older = result_run(hours=1)
    newer = result_run(hours=1, scale=10)
    query = {"topic": "orders", "stage": "publish"}
    rows = results(reader.get(f"{API}lag-stats/", query))
    assert [(row["run"], row["p50"]) for row in rows] == [(newer.pk, 10.0)]
    rows = results(reader.get(f"{API}lag-stats/", {**query, "run": str(older.pk)}))
    assert [(row["run"], row["p50"]) for row in rows] == [(older.pk, 1.0)]


def test_duplicate_stats_filter_by_hour_topic_and_group(reader: APIClient) -> None:
    result_run(hours=2)
    rows = results(
        reader.get(
            f"{API}duplicate-stats/",
            {"hour_after": "2026-03-01T01:00:00Z", "topic": "orders", "consumer_group": "audit"},
        )
    )
    assert len(rows) == 1
    assert rows[0]["duplicate_rate"] == 0.03
    assert rows[0]["deliveries"] == 100


def test_findings_filter_by_kind_run_and_event_id(reader: APIClient) -> None:
    first = result_run()
    second = result_run(since=RESULTS_START + timedelta(days=1))
    planted = finding_create(run=second, kind=ReconciliationFinding.Kind.RESENT)
    assert len(results(reader.get(f"{API}findings/"))) == 5
    assert len(results(reader.get(f"{API}findings/", {"run": str(first.pk)}))) == 2
    stuck = results(reader.get(f"{API}findings/", {"kind": "stuck", "run": str(second.pk)}))
    assert [row["kind"] for row in stuck] == ["stuck"]
    rows = results(reader.get(f"{API}findings/", {"event_id": planted.event_id}))
    assert [(row["id"], row["kind"], row["run"]) for row in rows] == [
        (planted.pk, "resent", second.pk)
    ]


@pytest.mark.parametrize(
    ("path", "query", "code", "words"),
    [
        ("lag-stats/", {"hour_after": "yesterday"}, "validation_error", "hour_after"),
        ("lag-stats/", {"stage": "queue"}, "validation_error", "stage"),
        (
            "lag-stats/",
            {"hour_after": "2026-03-02T00:00Z", "hour_before": "2026-03-01T00:00Z"},
            "validation_error",
            "hour_after (2026-03-02T00:00:00+00:00) must be before hour_before",
        ),
        ("duplicate-stats/", {"groupe": "billing"}, "unknown_filter", "Unknown filter groupe"),
        ("findings/", {"kind": "lost"}, "validation_error", "kind"),
        ("findings/", {"event_id": "not-a-uuid"}, "validation_error", "event_id"),
        ("findings/", {"run": "first"}, "validation_error", "run"),
        ("runs/", {"status": "DONE"}, "validation_error", "status"),
    ],
)
def test_bad_filters_are_refused_with_a_clear_message(
    reader: APIClient, path: str, query: dict[str, str], code: str, words: str
) -> None:
    response = reader.get(f"{API}{path}", query)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == code
    assert words in body["message"]


def test_starting_a_run_needs_its_own_permission(reader: APIClient) -> None:
    with mock.patch("analytics.tasks.run_analytics.delay") as delay:
        response = reader.post(f"{API}runs/start/", {}, format="json")
    assert response.status_code == 403
    assert not delay.called
    assert not OperatorAction.objects.exists()


def test_starting_a_run_queues_the_task_after_commit_and_is_audited(
    django_capture_on_commit_callbacks: Any,
) -> None:
    client = client_with("analytics.view_analyticsrun", "analytics.run_analytics")
    with (
        mock.patch("analytics.tasks.run_analytics.delay") as delay,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(
            f"{API}runs/start/",
            {"since": "2026-03-01T00:00Z", "until": "2026-03-01T06:00Z", "note": "backfill"},
            format="json",
        )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["queued"] is True
    assert body["window_start"].startswith("2026-03-01T00:00:00")
    delay.assert_called_once_with(
        trigger="api", since="2026-03-01T00:00:00+00:00", until="2026-03-01T06:00:00+00:00"
    )
    record = OperatorAction.objects.get(pk=body["audit_id"])
    assert (record.action, record.model, record.source, record.note) == (
        "analytics.run",
        "analytics.AnalyticsRun",
        "api",
        "backfill",
    )
    assert record.filters == {
        "since": "2026-03-01T00:00:00+00:00",
        "until": "2026-03-01T06:00:00+00:00",
    }


def test_starting_a_run_without_a_window_takes_the_last_closed_one(
    django_capture_on_commit_callbacks: Any,
) -> None:
    from analytics.services import analytics_window_default

    client = client_with("analytics.view_analyticsrun", "analytics.run_analytics")
    with (
        mock.patch("analytics.tasks.run_analytics.delay") as delay,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(f"{API}runs/start/", {}, format="json")
    assert response.status_code == 202, response.content
    since, until = analytics_window_default()
    assert delay.call_args.kwargs == {
        "trigger": "api",
        "since": since.isoformat(),
        "until": until.isoformat(),
    }


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"since": "2026-03-01T00:00Z"}, "Give both since and until"),
        (
            {"since": "2026-03-01T06:00Z", "until": "2026-03-01T00:00Z"},
            "must be before until",
        ),
        ({"since": "soon", "until": "2026-03-01T00:00Z"}, "since: Datetime has wrong format"),
    ],
)
def test_a_bad_window_is_refused_with_a_clear_message(body: dict[str, str], words: str) -> None:
    client = client_with("analytics.view_analyticsrun", "analytics.run_analytics")
    with mock.patch("analytics.tasks.run_analytics.delay") as delay:
        response = client.post(f"{API}runs/start/", body, format="json")
    assert response.status_code == 400
    assert words in response.json()["message"]
    assert not delay.called
    assert not OperatorAction.objects.exists()


def test_the_schema_describes_the_analytics_api(reader: APIClient) -> None:
    schema = reader.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    for path in (*LISTS, "runs/{id}/", "runs/start/"):
        assert f"{API}{path}" in paths
    parameters = {p["name"] for p in paths[f"{API}lag-stats/"]["get"]["parameters"]}
    assert {"hour_after", "hour_before", "topic", "event_type", "consumer_group"} <= parameters
    assert "202" in paths[f"{API}runs/start/"]["post"]["responses"]
