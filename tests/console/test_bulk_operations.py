"""console/bulk_operations.py and its pages: a bulk action needs a reason, a large one runs
as an operation in chunks under the rate cap, shows its progress and can be cancelled between
two chunks, in the admin and in the API."""

import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from console.audit import operator_action_record
from console.bulk_operations import (
    RUN_LOCK_NAMESPACE,
    Reaped,
    _apply_next_chunk,
    bulk_action_run,
    bulk_operation_cancel,
    bulk_operation_run,
    bulk_operations_reap,
)
from console.models import BulkOperation, BulkOperationChunk, OperatorAction
from console.operations import ACTIONS, ActionSpec, ReasonRequired
from console.tasks import reap_bulk_operations
from outbox.models import OutboxEvent
from outbox.selectors import outbox_events_with_delivery
from tests.conftest import (
    SESSION_POOL_PORT,
    TRANSACTION_POOL_PORT,
    connect_outside_django,
    connected_through,
)
from tests.console.conftest import VIEW_PERMISSIONS, client_for, logged_in
from tests.outbox.conftest import subprocess_environment, wait_until

pytestmark = pytest.mark.django_db

Action = OperatorAction.Action
Status = BulkOperation.Status
EVENTS_API = "/api/outbox/events/"
EVENTS_ADMIN = "/admin/outbox/outboxevent/"
OPERATIONS_API = "/api/bulk-operations/"


def failed_in_topic(topic: str) -> int:
    events = outbox_events_with_delivery(OutboxEvent.objects.filter(topic=topic))
    return events.filter(delivery_status="FAILED", delivery_discarded_at__isnull=True).count()


@pytest.fixture
def five_failed(make_event, settings) -> list[OutboxEvent]:
    settings.CONSOLE_BULK_CHUNK_SIZE = 2  # 5 rows: 3 chunks
    return [make_event(OutboxEvent.Status.FAILED, topic="bulk.orders") for _ in range(5)]


def queued_retry(operator, events) -> BulkOperation:
    """A retry of `events` submitted and not yet picked up by a worker (pytest-django's
    transaction never commits, so the task is not sent)."""
    record = bulk_action_run(
        user=operator,
        action=Action.OUTBOX_RETRY,
        source="api",
        reason="broker quota raised",
        ids=[event.pk for event in events],
    )
    return record.bulk_operation


def wait_for_run_lock_release(operation_id: int) -> None:
    """Waits until no session holds the run lock of the operation: a closed connection's
    backend releases its locks as it exits, a moment after the client has closed it."""

    def free() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", [RUN_LOCK_NAMESPACE, operation_id]
            )
            taken = bool(cursor.fetchone()[0])
            if taken:
                cursor.execute(
                    "SELECT pg_advisory_unlock(%s, %s)", [RUN_LOCK_NAMESPACE, operation_id]
                )
        return taken

    wait_until(free, timeout=10, message="the closed session's lock to go")


class FakeClock:
    """time.monotonic and time.sleep of a run, without waiting: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


# --- the reason --------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}])
def test_the_api_refuses_a_bulk_action_without_a_reason(operator, five_failed, body):
    response = client_for(operator).post(
        f"{EVENTS_API}bulk/retry/", {"filter": {"topic": "bulk.orders"}, **body}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "reason_required"
    assert failed_in_topic("bulk.orders") == 5
    assert not OperatorAction.objects.exists()
    assert not BulkOperation.objects.exists()


def test_a_dry_run_needs_no_reason(operator, five_failed):
    response = client_for(operator).post(
        f"{EVENTS_API}bulk/retry/",
        {"filter": {"topic": "bulk.orders"}, "dry_run": True},
        format="json",
    )
    assert (response.status_code, response.json()["matched"]) == (200, 5)


def test_the_admin_asks_again_for_a_blank_reason(operator, five_failed):
    response = logged_in(operator).post(
        f"{EVENTS_ADMIN}retry-matching/",
        {"_changelist_filters": "topic=bulk.orders", "reason": "  "},
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="reason-error"' in page
    assert "needs a reason" in page
    assert failed_in_topic("bulk.orders") == 5
    assert not OperatorAction.objects.exists()


def test_an_admin_list_action_asks_for_the_reason_first(operator, make_event):
    events = [make_event(OutboxEvent.Status.FAILED, topic="bulk.orders") for _ in range(2)]
    client = logged_in(operator)
    selection = {"action": "retry_selected", "_selected_action": [str(e.pk) for e in events]}
    confirm = client.post(EVENTS_ADMIN, selection)
    assert confirm.status_code == 200
    assert 'id="confirm-selected"' in confirm.content.decode()
    assert "Retry 2 rows" in confirm.content.decode()
    assert failed_in_topic("bulk.orders") == 2
    assert not OperatorAction.objects.exists()
    done = client.post(EVENTS_ADMIN, {**selection, "reason": "INC-7"}, follow=True)
    assert "Retry: 2 of 2 selected" in done.content.decode()
    assert failed_in_topic("bulk.orders") == 0
    assert OperatorAction.objects.get().reason == "INC-7"


def test_the_reason_page_counts_all_rows_selected_no_further_than_an_action_goes(
    operator, make_event, settings
):
    settings.CONSOLE_BULK_MAX_ROWS = 2
    events = [make_event(OutboxEvent.Status.FAILED, topic="bulk.orders") for _ in range(3)]
    selection = {
        "action": "retry_selected",
        "select_across": "1",
        "_selected_action": [str(events[0].pk)],
    }
    confirm = logged_in(operator).post(EVENTS_ADMIN, selection)
    assert "More than 2 outbox events selected" in confirm.content.decode()


def test_a_small_set_runs_at_once_and_is_recorded_as_a_finished_operation(operator, make_event):
    event = make_event(OutboxEvent.Status.FAILED)
    response = client_for(operator).post(
        f"{EVENTS_API}bulk/retry/", {"ids": [str(event.pk)], "reason": "one"}, format="json"
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["changed"], body["status"], body["queued_chunks"]) == (1, "DONE", 0)
    operation = BulkOperation.objects.get(pk=body["operation_id"])
    assert (operation.chunks_done, operation.rows_changed) == (1, 1)
    assert operation.audit.reason == "one"


# --- chunks, progress and the rate cap ------------------------------------------------------


def test_a_large_set_is_accepted_with_its_operations_url_and_runs_in_chunks(
    operator, five_failed, django_capture_on_commit_callbacks
):
    client = client_for(operator)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(
            f"{EVENTS_API}bulk/retry/",
            {"filter": {"topic": "bulk.orders"}, "reason": "broker quota raised"},
            format="json",
        )
    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["status"], body["queued_chunks"], body["changed"]) == ("QUEUED", 3, None)
    assert response["Location"] == body["operation_url"]
    assert body["operation_url"].endswith(f"/api/bulk-operations/{body['operation_id']}/")
    progress = client.get(body["operation_url"]).json()
    assert (progress["status"], progress["chunks_done"], progress["chunks_total"]) == (
        "QUEUED",
        0,
        3,
    )
    assert progress["reason"] == "broker quota raised"
    assert progress["rows_requested"] == 5
    for callback in callbacks:  # the commit sends the task; Celery runs it eagerly in tests
        callback()
    progress = client.get(body["operation_url"]).json()
    assert (progress["status"], progress["chunks_done"], progress["rows_done"]) == ("DONE", 3, 5)
    assert progress["rows_changed"] == 5
    assert progress["started_at"]
    assert progress["finished_at"]
    assert failed_in_topic("bulk.orders") == 0
    assert not BulkOperationChunk.objects.exists()
    entry = OperatorAction.objects.get(pk=body["audit_id"])
    assert (entry.changed, entry.chunks_pending, entry.reason) == (5, 0, "broker quota raised")


def test_the_run_pauses_between_chunks_to_keep_under_the_rate_cap(operator, five_failed, settings):
    settings.CONSOLE_BULK_MAX_ROWS_PER_SECOND = 4
    operation = queued_retry(operator, five_failed)
    clock = FakeClock()
    bulk_operation_run(operation_id=operation.pk, sleep=clock.sleep, clock=clock)
    # 2 rows: 0.5 s; 4 rows by 1.0 s; 5 rows by 1.25 s (chunks take no time on this clock).
    assert clock.sleeps == [0.5, 0.5, 0.25]
    operation.refresh_from_db()
    assert (operation.status, operation.rows_done) == (Status.DONE, 5)


def test_no_rate_cap_runs_the_chunks_back_to_back(operator, five_failed, settings):
    settings.CONSOLE_BULK_MAX_ROWS_PER_SECOND = 0
    operation = queued_retry(operator, five_failed)
    clock = FakeClock()
    bulk_operation_run(operation_id=operation.pk, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []
    operation.refresh_from_db()
    assert operation.status == Status.DONE


def test_progress_is_counted_chunk_by_chunk(operator, five_failed, settings):
    settings.CONSOLE_BULK_MAX_ROWS_PER_SECOND = 1
    operation = queued_retry(operator, five_failed)
    seen: list[tuple[str, int, int, int]] = []

    def look(seconds: float) -> None:  # what a progress page would read during the pause
        row = BulkOperation.objects.get(pk=operation.pk)
        seen.append((row.status, row.chunks_done, row.rows_done, row.rows_changed))

    bulk_operation_run(operation_id=operation.pk, sleep=look)
    assert seen == [("RUNNING", 1, 2, 2), ("RUNNING", 2, 4, 4), ("RUNNING", 3, 5, 5)]


def test_a_chunk_that_fails_marks_the_operation_failed_and_keeps_what_ran(
    operator, five_failed, monkeypatch
):
    operation = queued_retry(operator, five_failed)
    real = ACTIONS[Action.OUTBOX_RETRY]
    calls: list[int] = []

    def apply(ids: Any) -> int:
        calls.append(len(ids))
        if len(calls) == 2:
            raise ValueError("the handler registry is empty")
        return real.apply(ids)

    monkeypatch.setitem(
        ACTIONS, Action.OUTBOX_RETRY, ActionSpec(real.model, real.permission, apply)
    )
    bulk_operation_run(operation_id=operation.pk, sleep=lambda seconds: None)
    operation.refresh_from_db()
    assert operation.status == Status.FAILED
    assert operation.error == "ValueError: the handler registry is empty"
    assert (operation.chunks_done, operation.rows_changed) == (1, 2)
    assert failed_in_topic("bulk.orders") == 3


# --- cancel ------------------------------------------------------------------------------------


def test_a_cancel_during_the_run_stops_it_before_the_next_chunk(operator, five_failed, settings):
    settings.CONSOLE_BULK_MAX_ROWS_PER_SECOND = 1  # a pause after every chunk
    operation = queued_retry(operator, five_failed)

    def operator_clicks_cancel(seconds: float) -> None:
        bulk_operation_cancel(
            user=operator, operation=operation, source="admin", note="wrong topic"
        )

    bulk_operation_run(operation_id=operation.pk, sleep=operator_clicks_cancel)
    operation.refresh_from_db()
    assert operation.status == Status.CANCELLED
    assert (operation.chunks_done, operation.rows_done, operation.rows_changed) == (1, 2, 2)
    assert operation.cancelled_by == "operator"
    # The first chunk stays applied; the other three rows were never touched.
    assert failed_in_topic("bulk.orders") == 3
    assert not BulkOperationChunk.objects.exists()
    assert operation.audit.chunks_pending == 0
    cancel = OperatorAction.objects.get(action=Action.BULK_CANCEL)
    assert (cancel.object_ids, cancel.note) == ([str(operation.pk)], "wrong topic")


def test_a_second_run_does_nothing_while_another_holds_the_operation(operator, five_failed):
    operation = queued_retry(operator, five_failed)
    with connect_outside_django(connection.settings_dict) as other_worker:
        other_worker.execute("SELECT pg_advisory_lock(%s, %s)", [RUN_LOCK_NAMESPACE, operation.pk])
        bulk_operation_run(operation_id=operation.pk, sleep=lambda seconds: None)
        operation.refresh_from_db()
        assert (operation.status, operation.chunks_done) == (Status.QUEUED, 0)
        assert failed_in_topic("bulk.orders") == 5
    # That worker gone, its lock went with its connection: a redelivery runs it.
    wait_for_run_lock_release(operation.pk)
    bulk_operation_run(operation_id=operation.pk, sleep=lambda seconds: None)
    operation.refresh_from_db()
    assert (operation.status, operation.chunks_done) == (Status.DONE, 3)


def test_a_running_operation_whose_worker_died_is_cancelled_at_once(operator, five_failed):
    operation = queued_retry(operator, five_failed)
    # Claimed by a worker that died: RUNNING, and no run holds it.
    BulkOperation.objects.filter(pk=operation.pk).update(status=Status.RUNNING)

    cancelled = bulk_operation_cancel(user=operator, operation=operation, source="api")

    assert cancelled.status == Status.CANCELLED
    assert not BulkOperationChunk.objects.exists()
    assert failed_in_topic("bulk.orders") == 5


def test_the_api_cancels_a_queued_operation_at_once_and_then_refuses(operator, five_failed):
    operation = queued_retry(operator, five_failed)
    client = client_for(operator)
    url = f"/api/bulk-operations/{operation.pk}/"
    response = client.post(f"{url}cancel/", {"note": "not now"}, format="json")
    assert response.status_code == 200, response.json()
    assert (response.json()["status"], response.json()["cancelled_by"]) == ("CANCELLED", "operator")
    # A worker that gets the task afterwards does nothing.
    bulk_operation_run(operation_id=operation.pk, sleep=lambda seconds: None)
    assert failed_in_topic("bulk.orders") == 5
    assert client.get(url).json()["chunks_done"] == 0
    again = client.post(f"{url}cancel/", {}, format="json")
    assert again.status_code == 409
    assert again.json()["code"] == "operation_finished"


def test_the_admin_progress_page_offers_the_cancel_and_cancels(operator, five_failed):
    operation = queued_retry(operator, five_failed)
    client = logged_in(operator)
    page = client.get(f"/admin/console/bulkoperation/{operation.pk}/change/").content.decode()
    assert 'id="cancel-bulk"' in page
    assert "broker quota raised" in page
    response = client.post(f"/admin/console/bulkoperation/{operation.pk}/cancel/", follow=True)
    assert "cancelled." in response.content.decode()
    operation.refresh_from_db()
    assert operation.status == Status.CANCELLED


def test_reading_needs_the_models_view_permission_and_cancelling_its_action(
    make_user, operator, five_failed
):
    operation = queued_retry(operator, five_failed)
    url = f"/api/bulk-operations/{operation.pk}/"
    nobody = client_for(make_user("inbox.view_inboxmessage"))
    assert nobody.get(url).status_code == 403
    viewer = client_for(make_user(*VIEW_PERMISSIONS))
    assert viewer.get(url).status_code == 200
    refused = viewer.post(f"{url}cancel/", {}, format="json")
    assert (refused.status_code, refused.json()["code"]) == (403, "permission_denied")
    assert client_for(make_user()).get("/api/bulk-operations/abc/").status_code == 404
    operation.refresh_from_db()
    assert operation.status == Status.QUEUED
    admin_viewer = logged_in(make_user(*VIEW_PERMISSIONS))
    page = admin_viewer.get(f"/admin/console/bulkoperation/{operation.pk}/change/")
    assert 'id="cancel-bulk"' not in page.content.decode()
    assert admin_viewer.post(
        f"/admin/console/bulkoperation/{operation.pk}/cancel/"
    ).status_code in (
        302,
        403,
    )
    operation.refresh_from_db()
    assert operation.status == Status.QUEUED


def test_the_service_refuses_a_blank_reason(operator, make_event):
    with pytest.raises(ReasonRequired):
        bulk_action_run(user=operator, action=Action.OUTBOX_RETRY, source="api", reason=" ", ids=[])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CONSOLE_BULK_CHUNK_SIZE", 0),
        ("CONSOLE_BULK_MAX_ROWS", -1),
        ("CONSOLE_BULK_MAX_ROWS_PER_SECOND", -5),
        ("CONSOLE_BULK_MAX_ROWS_PER_SECOND", "fast"),
        ("CONSOLE_BULK_MAX_RESUMES", -1),
    ],
)
def test_a_bulk_setting_out_of_range_is_a_system_check_error(settings, name, value):
    settings.__setattr__(name, value)
    errors = [message for message in run_checks() if message.id == "console.E003"]
    assert [name in error.msg for error in errors] == [True]


# --- the list ----------------------------------------------------------------------------------


@pytest.fixture
def three_operations(operator, five_failed, make_message) -> list[BulkOperation]:
    """A queued outbox retry, a cancelled outbox discard and a finished inbox discard, created
    an hour apart, oldest first."""
    retry = queued_retry(operator, five_failed[:3])
    discard = bulk_action_run(
        user=operator,
        action=Action.OUTBOX_DISCARD,
        source="api",
        reason="wrong topic",
        ids=[event.pk for event in five_failed[2:]],
    ).bulk_operation
    bulk_operation_cancel(user=operator, operation=discard, source="api")
    message = make_message("FAILED")
    inbox = bulk_action_run(
        user=operator, action=Action.INBOX_DISCARD, source="api", reason="stale", ids=[message.pk]
    ).bulk_operation
    operations = [retry, discard, inbox]
    now = timezone.now()
    for hours_ago, operation in zip((3, 2, 1), operations, strict=True):
        BulkOperation.objects.filter(pk=operation.pk).update(
            created_at=now - timedelta(hours=hours_ago)
        )
        operation.refresh_from_db()
    return operations


def test_the_list_is_newest_first_and_paginated_by_cursor(operator, three_operations):
    client = client_for(operator)
    response = client.get(OPERATIONS_API)
    assert response.status_code == 200, response.content
    listed = response.json()["results"]
    assert [row["id"] for row in listed] == [op.pk for op in reversed(three_operations)]
    assert [row["status"] for row in listed] == ["DONE", "CANCELLED", "QUEUED"]
    assert listed[2]["reason"] == "broker quota raised"
    assert listed[0]["action"] == "inbox.discard"
    first = client.get(OPERATIONS_API, {"page_size": 2}).json()
    second = client.get(first["next"]).json()
    assert [row["id"] for row in first["results"] + second["results"]] == [
        op.pk for op in reversed(three_operations)
    ]
    assert second["next"] is None


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status": "QUEUED"}, [0]),
        ({"status": "CANCELLED"}, [1]),
        ({"action": "outbox.discard"}, [1]),
        ({"model": "outbox.OutboxEvent"}, [1, 0]),
        ({"model": "inbox.InboxMessage"}, [2]),
        ({"created_after": "HOURS_AGO_2_5"}, [2, 1]),
        ({"created_before": "HOURS_AGO_1_5"}, [1, 0]),
        ({"created_after": "HOURS_AGO_2_5", "created_before": "HOURS_AGO_1_5"}, [1]),
    ],
)
def test_the_list_filters_by_status_action_model_and_creation(
    operator, three_operations, query, expected
):
    now = timezone.now()
    times = {
        "HOURS_AGO_2_5": now - timedelta(hours=2.5),
        "HOURS_AGO_1_5": now - timedelta(hours=1.5),
    }
    query = {
        key: times[value].isoformat() if value in times else value for key, value in query.items()
    }
    response = client_for(operator).get(OPERATIONS_API, query)
    assert response.status_code == 200, response.content
    assert [row["id"] for row in response.json()["results"]] == [
        three_operations[index].pk for index in expected
    ]


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"status": "LOST"}, "validation_error"),
        ({"action": "outbox.release_key"}, "validation_error"),
        ({"created_after": "yesterday"}, "validation_error"),
        ({"created_after": "2026-03-01T00:00:00+22:00"}, "validation_error"),
        ({"stauts": "DONE"}, "unknown_filter"),
        ({"cursor": "not a cursor"}, "invalid_cursor"),
    ],
)
def test_a_bad_list_query_is_a_400_with_a_code(operator, three_operations, query, code):
    response = client_for(operator).get(OPERATIONS_API, query)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code


def test_the_list_holds_only_the_operations_on_models_the_user_may_read(
    make_user, three_operations
):
    inbox_reader = client_for(make_user("inbox.view_inboxmessage"))
    listed = inbox_reader.get(OPERATIONS_API).json()["results"]
    assert [row["id"] for row in listed] == [three_operations[2].pk]
    assert client_for(make_user()).get(OPERATIONS_API).json()["results"] == []
    assert APIClient().get(OPERATIONS_API).status_code in (401, 403)


# --- the reaper: operations whose worker died ---------------------------------------------------


def claimed_by_a_dead_worker(operator, events, *, chunks_applied: int = 0) -> BulkOperation:
    """A queued retry that a worker claimed, applied `chunks_applied` chunks of, and died:
    RUNNING, and no run holds it."""
    operation = queued_retry(operator, events)
    for _ in range(chunks_applied):
        _apply_next_chunk(BulkOperation.objects.select_related("audit").get(pk=operation.pk))
    BulkOperation.objects.filter(pk=operation.pk).update(
        status=Status.RUNNING, started_at=timezone.now()
    )
    return operation


def test_a_running_operation_whose_worker_died_is_resumed_where_it_stopped(
    operator, five_failed, django_capture_on_commit_callbacks
):
    operation = claimed_by_a_dead_worker(operator, five_failed, chunks_applied=1)
    assert failed_in_topic("bulk.orders") == 3

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        reap_bulk_operations.apply()
    operation.refresh_from_db()
    assert (operation.status, operation.resumes, operation.chunks_done) == (Status.QUEUED, 1, 1)
    assert len(callbacks) == 1  # the run's task, sent once the reap commits

    for callback in callbacks:  # Celery runs the task eagerly in tests
        callback()
    operation.refresh_from_db()
    assert (operation.status, operation.chunks_done, operation.rows_done) == (Status.DONE, 3, 5)
    assert operation.rows_changed == 5
    assert failed_in_topic("bulk.orders") == 0
    assert not BulkOperationChunk.objects.exists()


def test_a_running_operation_whose_run_is_alive_is_left_alone_until_it_dies(
    operator, five_failed, django_capture_on_commit_callbacks
):
    operation = claimed_by_a_dead_worker(operator, five_failed)
    with connect_outside_django(connection.settings_dict) as live_worker:
        live_worker.execute("SELECT pg_advisory_lock(%s, %s)", [RUN_LOCK_NAMESPACE, operation.pk])
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            reaped = bulk_operations_reap()
        assert reaped == Reaped()
        assert callbacks == []
        operation.refresh_from_db()
        assert (operation.status, operation.resumes) == (Status.RUNNING, 0)
    # That worker's session gone (the process died), its lock went with it.
    wait_for_run_lock_release(operation.pk)
    with django_capture_on_commit_callbacks(execute=False):
        assert bulk_operations_reap() == Reaped(resumed=[operation.pk])


def test_an_operation_whose_worker_keeps_dying_fails_after_the_resumes_allowed(
    operator, five_failed, settings, django_capture_on_commit_callbacks
):
    settings.CONSOLE_BULK_MAX_RESUMES = 2
    operation = claimed_by_a_dead_worker(operator, five_failed, chunks_applied=1)
    for resumes in (1, 2):
        with django_capture_on_commit_callbacks(execute=False):
            assert bulk_operations_reap() == Reaped(resumed=[operation.pk])
        # A worker claims it again, and dies.
        BulkOperation.objects.filter(pk=operation.pk).update(status=Status.RUNNING)
        operation.refresh_from_db()
        assert operation.resumes == resumes

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert bulk_operations_reap() == Reaped(failed=[operation.pk])
    assert callbacks == []
    operation.refresh_from_db()
    assert operation.status == Status.FAILED
    assert "died" in operation.error
    assert "CONSOLE_BULK_MAX_RESUMES is 2" in operation.error
    assert "the 2 left were not" in operation.error
    assert operation.finished_at is not None
    assert not BulkOperationChunk.objects.exists()
    assert OperatorAction.objects.get(pk=operation.audit_id).chunks_pending == 0
    assert failed_in_topic("bulk.orders") == 3  # the applied chunk stays applied


def test_a_dead_operation_with_a_cancel_requested_is_cancelled(
    operator, five_failed, django_capture_on_commit_callbacks
):
    operation = claimed_by_a_dead_worker(operator, five_failed)
    BulkOperation.objects.filter(pk=operation.pk).update(cancel_requested_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert bulk_operations_reap() == Reaped(cancelled=[operation.pk])
    assert callbacks == []
    operation.refresh_from_db()
    assert operation.status == Status.CANCELLED
    assert failed_in_topic("bulk.orders") == 5


def test_a_worker_killed_in_the_middle_of_a_run_is_resumed_by_the_reaper(
    transactional_db, operator, five_failed, settings
):
    # Stored as bulk_action_run stores it, without sending the task (with a committing
    # database, Celery's eager mode would run it here at once).
    ids = [str(event.pk) for event in five_failed]
    record = operator_action_record(
        user=operator,
        action=Action.OUTBOX_RETRY,
        model="outbox.OutboxEvent",
        source="api",
        requested=5,
        object_ids=ids,
        reason="broker quota raised",
        chunks_pending=3,
    )
    operation = BulkOperation.objects.create(audit=record, chunks_total=3)
    BulkOperationChunk.objects.bulk_create(
        BulkOperationChunk(operation=operation, index=index, object_ids=ids[index * 2 :][:2])
        for index in range(3)
    )
    # A worker in another process, paced to 1 row a second: after its first chunk (2 rows) it
    # pauses for 2 s, and is killed there.
    worker = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from console.bulk_operations import bulk_operation_run; "
            f"bulk_operation_run(operation_id={operation.pk})",
        ],
        cwd=settings.BASE_DIR,
        env=subprocess_environment(CONSOLE_BULK_MAX_ROWS_PER_SECOND="1"),
    )
    try:
        wait_until(
            lambda: BulkOperation.objects.get(pk=operation.pk).chunks_done == 1,
            timeout=60,
            message="the worker's first chunk",
        )
        # Alive, it holds the operation: the reaper leaves it alone.
        assert bulk_operations_reap() == Reaped()
    finally:
        worker.kill()
        worker.wait()
    operation.refresh_from_db()
    assert (operation.status, operation.chunks_done) == (Status.RUNNING, 1)

    # Its session gone with it, the reaper resumes the operation; the task it sends runs here
    # (Celery's eager mode), without the rate cap.
    settings.CONSOLE_BULK_MAX_ROWS_PER_SECOND = 0
    wait_until(
        lambda: bulk_operations_reap().resumed == [operation.pk],
        timeout=30,
        message="the killed worker's lock to go",
    )
    operation.refresh_from_db()
    assert (operation.status, operation.resumes) == (Status.DONE, 1)
    assert (operation.chunks_done, operation.rows_done, operation.rows_changed) == (3, 5, 5)
    assert failed_in_topic("bulk.orders") == 0


def test_beat_reaps_the_bulk_operations_every_minute(settings):
    entries = [
        entry
        for entry in settings.CELERY_BEAT_SCHEDULE.values()
        if entry["task"] == reap_bulk_operations.name
    ]
    assert [entry["schedule"] for entry in entries] == [60.0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("port", "status"),
    [(TRANSACTION_POOL_PORT, Status.FAILED), (SESSION_POOL_PORT, Status.DONE)],
    ids=["transaction-pool", "session-pool"],
)
def test_a_run_through_a_transaction_mode_pool_fails_naming_what_to_set(
    operator, five_failed, port, status
):
    """A run holds an advisory lock of its session: through a pool in transaction mode that
    lock would stay on a server session other clients get. The run refuses, says what to set,
    and leaves nothing applied and no lock behind; through a session-mode pool it runs."""
    with connected_through(port):
        # The commit sends the task, which Celery runs at once here, through the same pool.
        operation = queued_retry(operator, five_failed)
        operation.refresh_from_db()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
                [operation.pk],
            )
            locks = cursor.fetchone()[0]

    assert operation.status == status, operation.error
    assert locks == 0
    if status == Status.FAILED:
        assert "transaction mode" in operation.error, operation.error
        assert "DATABASE_URL" in operation.error, operation.error
        assert failed_in_topic("bulk.orders") == 5
    else:
        assert failed_in_topic("bulk.orders") == 0
    assert not BulkOperationChunk.objects.exists()
