"""console/api/failure_groups.py: the failure groups of the outbox and of the inbox as JSON,
and the retry or discard of one group as a bulk action (dry run, reason, audit, a bulk
operation for a large group)."""

import pytest
from django.utils import timezone

from console.models import BulkOperation, OperatorAction
from console.selectors import NO_ERROR_TEXT
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from outbox.selectors import outbox_event_delivered
from tests.console.conftest import TOO_LARGE, VIEW_PERMISSIONS, client_for

pytestmark = pytest.mark.django_db

OUTBOX = "/api/outbox/failure-groups/"
INBOX = "/api/inbox/failure-groups/"


@pytest.fixture
def failed_events(failed_events, make_event):
    """The conftest's groups, and two FAILED-looking events that belong to none."""
    return {
        **failed_events,
        # In no group: discarded by an operator, or still backing off.
        "discarded": [
            make_event(
                OutboxEvent.Status.FAILED,
                topic="orders.a",
                error=TOO_LARGE,
                discarded_at=timezone.now(),
            )
        ],
        "backing_off": [
            make_event(OutboxEvent.Status.PENDING, topic="orders.a", error=TOO_LARGE, attempts=2)
        ],
    }


def status(event: OutboxEvent) -> str:
    return str(outbox_event_delivered(event_id=event.pk).delivery_status)


def test_the_outbox_groups_are_listed_largest_first_with_a_sample(viewer, failed_events):
    response = client_for(viewer).get(OUTBOX)
    assert response.status_code == 200, response.content
    groups = response.json()
    assert [(g["error_class"], g["topic"], g["count"]) for g in groups] == [
        ("MSG_SIZE_TOO_LARGE", "orders.a", 3),
        ("MSG_SIZE_TOO_LARGE", "orders.b", 2),
        ("MSG_TIMED_OUT", "orders.a", 1),
    ]
    largest = groups[0]
    assert largest["sample_id"] in {str(event.pk) for event in failed_events["large_a"]}
    assert largest["sample_error"] == TOO_LARGE
    assert largest["first_seen"] <= largest["last_seen"]
    assert largest["sample_url"].endswith(f"/api/outbox/events/{largest['sample_id']}/")
    assert client_for(viewer).get(largest["sample_url"]).status_code == 200
    assert "consumer_group" not in largest


def test_retrying_an_outbox_group_previews_its_count_then_retries_it_alone(operator, failed_events):
    client = client_for(operator)
    group = {"error_class": "MSG_SIZE_TOO_LARGE", "topic": "orders.a"}
    preview = client.post(f"{OUTBOX}retry/", {**group, "dry_run": True}, format="json")
    assert preview.status_code == 200, preview.content
    assert (preview.json()["matched"], preview.json()["dry_run"]) == (3, True)
    assert not OperatorAction.objects.exists()

    refused = client.post(f"{OUTBOX}retry/", group, format="json")
    assert (refused.status_code, refused.json()["code"]) == (400, "reason_required")

    response = client.post(
        f"{OUTBOX}retry/", {**group, "reason": "broker limit raised"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert (response.json()["matched"], response.json()["changed"]) == (3, 3)
    entry = OperatorAction.objects.get(pk=response.json()["audit_id"])
    assert (entry.action, entry.source, entry.reason) == (
        "outbox.retry",
        "api",
        "broker limit raised",
    )
    assert entry.filters == {"failure_group": group}
    assert {status(event) for event in failed_events["large_a"]} == {"PENDING"}
    assert {status(event) for event in failed_events["large_b"]} == {"FAILED"}
    assert {status(event) for event in failed_events["timeout_a"]} == {"FAILED"}
    assert {status(event) for event in failed_events["discarded"]} == {"FAILED"}
    assert outbox_event_delivered(event_id=failed_events["discarded"][0].pk).delivery_discarded_at
    # Retried, the group is gone: acting on it again is bad input, not an empty success.
    again = client.post(f"{OUTBOX}retry/", {**group, "dry_run": True}, format="json")
    assert (again.status_code, again.json()["code"]) == (400, "unknown_failure_group")


def test_a_large_group_is_queued_as_a_bulk_operation_like_the_bulk_endpoints(
    operator, failed_events, settings
):
    settings.CONSOLE_BULK_CHUNK_SIZE = 2  # the group's 3 rows: 2 chunks
    response = client_for(operator).post(
        f"{OUTBOX}discard/",
        {"error_class": "MSG_SIZE_TOO_LARGE", "topic": "orders.a", "reason": "too big to send"},
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["status"], body["queued_chunks"], body["matched"]) == ("QUEUED", 2, 3)
    assert response["Location"] == body["operation_url"]
    assert body["operation_url"].endswith(f"/api/bulk-operations/{body['operation_id']}/")
    operation = BulkOperation.objects.get(pk=body["operation_id"])
    assert operation.audit.action == "outbox.discard"


def test_an_inbox_group_is_named_with_its_consumer_group_and_discarded_alone(
    operator, make_message
):
    def failed(group: str, error: str, count: int) -> list[InboxMessage]:
        return [
            make_message(InboxMessage.Status.FAILED, group=group, last_error=error)
            for _ in range(count)
        ]

    value_errors = failed("billing", "ValueError: no price\n  File ...", 2)
    other_group = failed("shipping", "ValueError: no price", 1)
    no_text = failed("billing", "", 1)
    client = client_for(operator)
    listed = {(g["error_class"], g["consumer_group"]): g for g in client.get(INBOX).json()}
    assert {key: g["count"] for key, g in listed.items()} == {
        ("ValueError", "billing"): 2,
        ("ValueError", "shipping"): 1,
        (NO_ERROR_TEXT, "billing"): 1,
    }
    assert listed[("ValueError", "billing")]["sample_id"] in {m.pk for m in value_errors}

    group = {"error_class": "ValueError", "topic": "console.orders", "consumer_group": "billing"}
    response = client.post(f"{INBOX}discard/", {**group, "reason": "stale orders"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["changed"] == 2
    discarded = set(
        InboxMessage.objects.filter(discarded_at__isnull=False).values_list("pk", flat=True)
    )
    assert discarded == {message.pk for message in value_errors}
    # The rows without error text are a group of their own, acted on as one.
    response = client.post(
        f"{INBOX}retry/",
        {**group, "error_class": NO_ERROR_TEXT, "dry_run": True},
        format="json",
    )
    assert response.json()["matched"] == 1
    assert other_group[0].pk not in discarded
    assert no_text[0].pk not in discarded


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        (f"{OUTBOX}retry/", {"error_class": "NOPE", "topic": "orders.a"}, "unknown_failure_group"),
        # A group exists only as the whole key: its class on another topic is no group.
        (
            f"{OUTBOX}discard/",
            {"error_class": "MSG_TIMED_OUT", "topic": "orders.b", "dry_run": True},
            "unknown_failure_group",
        ),
        (f"{OUTBOX}retry/", {"topic": "orders.a"}, "validation_error"),
        (f"{OUTBOX}retry/", {"error_class": "x", "topic": "t" * 250}, "validation_error"),
        (f"{OUTBOX}retry/", {"error_class": "x\x00", "topic": "orders.a"}, "validation_error"),
        (f"{OUTBOX}retry/", {"error_class": ["x"], "topic": "orders.a"}, "validation_error"),
        (
            f"{INBOX}retry/",
            {"error_class": "ValueError", "topic": "console.orders"},
            "validation_error",
        ),
    ],
)
def test_bad_input_is_a_400_with_a_code(operator, failed_events, path, body, code):
    response = client_for(operator).post(path, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code
    assert not OperatorAction.objects.exists()


def test_acting_on_a_group_needs_the_actions_permission(make_user, failed_events):
    viewer = client_for(make_user(*VIEW_PERMISSIONS))
    assert viewer.get(OUTBOX).status_code == 200
    group = {"error_class": "MSG_TIMED_OUT", "topic": "orders.a", "reason": "tidy"}
    assert viewer.post(f"{OUTBOX}discard/", group, format="json").status_code == 403
    retrier = client_for(make_user(*VIEW_PERMISSIONS, "outbox.retry_outboxevent"))
    assert retrier.post(f"{OUTBOX}discard/", group, format="json").status_code == 403
    assert retrier.post(f"{OUTBOX}retry/", group, format="json").status_code == 200
    nobody = client_for(make_user("inbox.view_inboxmessage"))
    assert nobody.get(OUTBOX).status_code == 403
    assert nobody.get(INBOX).status_code == 200
    assert {status(event) for event in failed_events["timeout_a"]} == {"PENDING"}


def test_the_list_takes_no_filters(viewer, failed_events):
    response = client_for(viewer).get(OUTBOX, {"topic": "orders.b"})
    assert (response.status_code, response.json()["code"]) == (400, "unknown_filter")
