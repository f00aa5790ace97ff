"""The REST API: authentication, a permission per action, filters, bulk dry runs, bad input,
and JSON errors with a code and a message."""

import json
import re
import uuid

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from console.models import ApiToken, OperatorAction
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from outbox.selectors import (
    outbox_event_delivered,
    outbox_events_in_state,
    outbox_events_with_delivery,
)
from tests.console.conftest import VIEW_PERMISSIONS, client_for

pytestmark = pytest.mark.django_db

EVENTS = "/api/outbox/events/"
MESSAGES = "/api/inbox/messages/"


def events_in_state(state: str):
    """The outbox events whose delivery is in `state` (or were "discarded")."""
    return outbox_events_in_state(
        outbox_events_with_delivery(OutboxEvent.objects.all()), state=state
    )


READ_ENDPOINTS = [
    EVENTS,
    MESSAGES,
    "/api/stats/summary/",
    "/api/stats/consumer-lag/",
    "/api/schema/",
    "/api/docs/",
]


@pytest.mark.parametrize("url", READ_ENDPOINTS)
def test_anonymous_requests_are_refused(api, url):
    response = api.get(url)
    assert response.status_code in (401, 403)


@pytest.mark.parametrize(
    "url",
    [
        f"{EVENTS}bulk/retry/",
        f"{EVENTS}bulk/discard/",
        f"{EVENTS}bulk/replay/",
        f"{EVENTS}keys/release/",
        f"{MESSAGES}bulk/retry/",
        f"{MESSAGES}bulk/replay/",
    ],
)
def test_anonymous_actions_are_refused_with_a_json_error(api, url):
    response = api.post(url, {"filter": {"status": "FAILED"}}, format="json")
    assert response.status_code in (401, 403)
    assert response.json()["code"] in ("not_authenticated", "authentication_failed")
    assert response.json()["message"]


def test_token_authentication_works(api, viewer, make_event):
    make_event()
    _, token = ApiToken.objects.create(user=viewer, name="read-only")
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get(EVENTS).status_code == 200


def test_session_authentication_works(viewer, make_event):
    client = APIClient()
    # The console's one login page; the API shares its session.
    client.post("/admin/login/", {"username": "viewer", "password": "pw"})
    assert client.get(EVENTS).status_code == 200


def test_a_user_without_the_view_permission_gets_403(make_user):
    nobody = client_for(make_user())
    response = nobody.get(EVENTS)
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"


@pytest.mark.parametrize(
    ("url_suffix", "status", "permission", "body"),
    [
        ("retry/", OutboxEvent.Status.FAILED, "outbox.retry_outboxevent", {}),
        ("discard/", OutboxEvent.Status.FAILED, "outbox.discard_outboxevent", {}),
        ("replay/", OutboxEvent.Status.DONE, "outbox.replay_outboxevent", {"new_event_id": False}),
    ],
)
def test_each_outbox_action_needs_its_own_permission(
    make_user, make_event, url_suffix, status, permission, body
):
    event = make_event(status)
    url = f"{EVENTS}{event.pk}/{url_suffix}"
    others = [
        p
        for p in (
            "outbox.retry_outboxevent",
            "outbox.discard_outboxevent",
            "outbox.replay_outboxevent",
        )
        if p != permission
    ]
    without = client_for(make_user(*VIEW_PERMISSIONS, *others))
    response = without.post(url, body, format="json")
    assert response.status_code == 403
    with_permission = client_for(make_user(*VIEW_PERMISSIONS, permission))
    response = with_permission.post(url, {**body, "note": "ticket 42"}, format="json")
    assert response.status_code == 200, response.json()
    entry = OperatorAction.objects.get()
    assert entry.source == "api"
    assert entry.requested == entry.changed == 1
    assert entry.note == "ticket 42"
    assert entry.object_ids[0] == str(event.pk)


def test_retry_puts_a_failed_event_back_to_pending(operator, make_event):
    event = make_event(OutboxEvent.Status.FAILED)
    response = client_for(operator).post(f"{EVENTS}{event.pk}/retry/", {}, format="json")
    assert response.status_code == 200
    assert response.json()["status"] == "PENDING"
    # Due now, with a fresh set of attempts; the tries made so far stay in its history.
    assert response.json()["next_attempt_at"] is not None
    assert response.json()["attempts"] == 10
    assert len(client_for(operator).get(f"{EVENTS}{event.pk}/attempts/").json()["results"]) == 10


def test_an_illegal_transition_is_a_409_with_the_services_code(operator, make_event):
    event = make_event(OutboxEvent.Status.DONE)
    response = client_for(operator).post(f"{EVENTS}{event.pk}/retry/", {}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "illegal_transition"
    assert "replay it instead" in response.json()["message"]


def test_replay_with_a_new_event_id_returns_the_new_event(operator, make_event):
    event = make_event(OutboxEvent.Status.DONE)
    response = client_for(operator).post(
        f"{EVENTS}{event.pk}/replay/", {"new_event_id": True}, format="json"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["id"] != str(event.pk)
    assert body["headers"]["replay_of"] == str(event.pk)
    assert OperatorAction.objects.get().action == OperatorAction.Action.OUTBOX_REPLAY_NEW_ID


def test_list_filters_and_omits_payloads(viewer, make_event):
    failed = make_event(OutboxEvent.Status.FAILED, event_type="OrderCancelled")
    make_event(OutboxEvent.Status.DONE)
    make_event(OutboxEvent.Status.PENDING, event_type="OrderCancelled")
    client = client_for(viewer)
    body = client.get(EVENTS, {"status": "FAILED"}).json()
    assert [row["id"] for row in body["results"]] == [str(failed.pk)]
    assert "payload" not in body["results"][0]
    assert "next" in body
    assert "count" not in body
    body = client.get(EVENTS, {"event_type": "OrderCancelled"}).json()
    assert len(body["results"]) == 2
    body = client.get(EVENTS, {"id": str(failed.pk)}).json()
    assert len(body["results"]) == 1


def test_list_filters_by_discard_and_publication_time(viewer, make_event):
    from datetime import timedelta

    from django.utils import timezone

    failed = make_event(OutboxEvent.Status.FAILED)
    discarded = make_event(OutboxEvent.Status.FAILED, discarded_at=timezone.now())
    old = make_event(OutboxEvent.Status.DONE, published_at=timezone.now() - timedelta(days=2))
    recent = make_event(OutboxEvent.Status.DONE)
    client = client_for(viewer)

    def ids(**query):
        return {row["id"] for row in client.get(EVENTS, query).json()["results"]}

    assert ids(discarded="true") == {str(discarded.pk)}
    assert ids(status="FAILED", discarded="false") == {str(failed.pk)}
    since = (timezone.now() - timedelta(days=1)).isoformat()
    assert ids(published_after=since) == {str(recent.pk)}
    assert ids(published_before=since) == {str(old.pk)}


def test_an_actions_response_reports_the_delivery(operator, make_event):
    event = make_event(OutboxEvent.Status.FAILED)
    body = client_for(operator).post(f"{EVENTS}{event.pk}/discard/", {}, format="json").json()
    assert body["status"] == "FAILED"
    assert body["discarded_at"] is not None
    assert body["attempts"] == 10


def test_cursor_pagination_walks_every_row_once(viewer, make_event):
    created = {str(make_event().pk) for _ in range(7)}
    client = client_for(viewer)
    seen: list[str] = []
    url = f"{EVENTS}?page_size=3"
    while url:
        body = client.get(url).json()
        seen.extend(row["id"] for row in body["results"])
        url = body["next"]
    assert sorted(seen) == sorted(created)


@pytest.mark.parametrize("page_size", [1, 2, 3, 5])
def test_the_list_pages_newest_first_through_events_of_one_transaction(
    viewer: User, page_size: int
) -> None:
    """The list is ordered by transaction, then position, newest first: the cursor holds a
    transaction id, which events published together share."""
    from django.db import transaction

    import outbox

    written: list[str] = []
    for size in (4, 1, 3):
        with transaction.atomic():
            for _ in range(size):
                event = outbox.publish(
                    aggregate_type="order",
                    aggregate_id="order-1",
                    event_type="OrderPlaced",
                    payload={},
                )
                written.append(str(event.pk))
    client = client_for(viewer)
    seen: list[str] = []
    url = f"{EVENTS}?page_size={page_size}"
    while url:
        body = client.get(url).json()
        assert len(body["results"]) <= page_size
        seen.extend(row["id"] for row in body["results"])
        url = body["next"]
    assert seen == written[::-1]


def test_detail_shows_payload_headers_and_the_consumers_timeline(
    payload_viewer, make_event, make_message
):
    event = make_event(OutboxEvent.Status.DONE)
    make_message(event_id=str(event.pk), group="billing")
    make_message(InboxMessage.Status.FAILED, event_id=str(event.pk), group="shipping")
    body = client_for(payload_viewer).get(f"{EVENTS}{event.pk}/").json()
    assert body["payload"]["amount"] == "12.50"
    assert body["headers"]["tenant"] == "acme"
    assert body["kafka_partition"] == 0
    assert body["kafka_offset"] == 41
    assert sorted(row["consumer_group"] for row in body["consumers"]) == ["billing", "shipping"]


@pytest.mark.parametrize(
    ("query", "code", "words"),
    [
        ({"status": "LOST"}, "validation_error", "LOST is not one of the available choices"),
        ({"id": "not-a-uuid"}, "validation_error", "valid UUID"),
        ({"created_after": "yesterday"}, "validation_error", "created_after"),
        ({"colour": "red"}, "unknown_filter", "Unknown filter colour"),
    ],
)
def test_bad_filters_get_400_with_a_clear_message(viewer, query, code, words):
    response = client_for(viewer).get(EVENTS, query)
    assert response.status_code == 400
    assert response.json()["code"] == code
    assert words in response.json()["message"]


def test_a_malformed_event_id_gets_400(viewer):
    response = client_for(viewer).get(f"{EVENTS}12345/")
    assert response.status_code == 400
    assert response.json() == {
        "code": "invalid_id",
        "message": "'12345' is not an event id; event ids are UUIDs.",
    }


def test_an_unknown_event_id_gets_404(viewer):
    response = client_for(viewer).get(f"{EVENTS}{uuid.uuid4()}/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_bulk_dry_run_counts_and_changes_nothing(operator, make_event):
    for _ in range(3):
        make_event(OutboxEvent.Status.FAILED)
    make_event(OutboxEvent.Status.DONE)
    response = client_for(operator).post(
        f"{EVENTS}bulk/retry/", {"filter": {"status": "FAILED"}, "dry_run": True}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["matched"] == 3
    assert response.json()["dry_run"] is True
    assert events_in_state("FAILED").count() == 3
    assert not OperatorAction.objects.exists()


def test_bulk_retry_by_filter_changes_the_rows_and_is_audited(operator, make_event):
    for _ in range(3):
        make_event(OutboxEvent.Status.FAILED, topic="console.payments")
    make_event(OutboxEvent.Status.FAILED, topic="console.other")
    response = client_for(operator).post(
        f"{EVENTS}bulk/retry/",
        {"filter": {"status": "FAILED", "topic": "console.payments"}, "reason": "broker fixed"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert response.json()["matched"] == 3
    assert response.json()["changed"] == 3
    assert list(events_in_state("FAILED").values_list("topic", flat=True)) == ["console.other"]
    entry = OperatorAction.objects.get()
    assert entry.filters == {"status": "FAILED", "topic": "console.payments"}
    assert entry.username == "operator"
    assert entry.reason == "broker fixed"


def test_bulk_discard_by_ids(operator, make_event):
    events = [make_event(OutboxEvent.Status.FAILED) for _ in range(2)]
    response = client_for(operator).post(
        f"{EVENTS}bulk/discard/",
        {"ids": [str(e.pk) for e in events], "reason": "poison events"},
        format="json",
    )
    assert response.json()["changed"] == 2
    assert events_in_state("discarded").count() == 2


def test_bulk_needs_the_actions_permission_even_for_a_dry_run(viewer):
    response = client_for(viewer).post(
        f"{EVENTS}bulk/retry/", {"filter": {"status": "FAILED"}, "dry_run": True}, format="json"
    )
    assert response.status_code == 403


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        ({"filter": {"status": "LOST"}}, "validation_error", "LOST"),
        ({"filter": {"colour": "red"}}, "unknown_filter", "Unknown filter colour"),
        ({"filter": {}}, "empty_filter", "every row"),
        ({"ids": ["nope"]}, "validation_error", "valid UUID"),
        ({}, "validation_error", "either 'ids' or 'filter'"),
    ],
)
def test_bad_bulk_input_gets_400(operator, body, code, words):
    response = client_for(operator).post(f"{EVENTS}bulk/retry/", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == code
    assert words in response.json()["message"]


def test_an_oversized_body_gets_400_with_a_json_error(operator, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = json.dumps({"ids": [str(uuid.uuid4()) for _ in range(100)]})
    response = client_for(operator).post(
        f"{EVENTS}bulk/retry/", body, content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "request_too_large"
    assert (
        f"The request body is {len(body)} bytes; the limit is 1024" in (response.json()["message"])
    )


def test_read_only_fields_cannot_be_written(operator, make_event):
    event = make_event()
    client = client_for(operator)
    assert (
        client.patch(f"{EVENTS}{event.pk}/", {"status": "DONE"}, format="json").status_code == 405
    )
    assert client.put(f"{EVENTS}{event.pk}/", {"status": "DONE"}, format="json").status_code == 405
    assert client.post(EVENTS, {"status": "DONE"}, format="json").status_code == 405
    assert outbox_event_delivered(event_id=event.pk).delivery_status == "PENDING"


def test_throttling_answers_429_in_json(operator, make_event, settings):
    from rest_framework.throttling import ScopedRateThrottle

    event = make_event(OutboxEvent.Status.FAILED)
    rates = {**ScopedRateThrottle.THROTTLE_RATES, "actions": "2/minute"}
    original = ScopedRateThrottle.THROTTLE_RATES
    ScopedRateThrottle.THROTTLE_RATES = rates
    try:
        client = client_for(operator)
        responses = [client.post(f"{EVENTS}{event.pk}/retry/", {}, format="json") for _ in range(3)]
    finally:
        ScopedRateThrottle.THROTTLE_RATES = original
    assert responses[-1].status_code == 429
    assert responses[-1].json()["code"] == "throttled"
    assert responses[-1].json()["message"]


def test_release_key(operator, make_event):
    blocked = make_event(OutboxEvent.Status.FAILED, key="order-7", topic="console.orders")
    response = client_for(operator).post(
        f"{EVENTS}keys/release/", {"topic": "console.orders", "key": "order-7"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["changed"] == 1
    assert outbox_event_delivered(event_id=blocked.pk).delivery_discarded_at is not None


# --- inbox ------------------------------------------------------------------------------------


def test_inbox_list_filters(viewer, make_message):
    failed = make_message(InboxMessage.Status.FAILED, group="shipping")
    make_message(group="billing")
    client = client_for(viewer)
    body = client.get(MESSAGES, {"status": "FAILED", "consumer_group": "shipping"}).json()
    assert [row["id"] for row in body["results"]] == [failed.pk]
    assert "payload" not in body["results"][0]
    assert client.get(MESSAGES, {"status": "nope"}).status_code == 400


def test_inbox_malformed_id_gets_400(viewer):
    response = client_for(viewer).get(f"{MESSAGES}abc/")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_id"


@pytest.mark.parametrize(
    ("suffix", "permission", "status", "discarded"),
    [
        ("retry/", "inbox.retry_inboxmessage", "PENDING", False),
        ("replay/", "inbox.replay_inboxmessage", "PENDING", False),
        ("discard/", "inbox.discard_inboxmessage", "FAILED", True),
    ],
)
def test_each_inbox_action_needs_its_own_permission(
    make_user, make_message, suffix, permission, status, discarded
):
    message = make_message(InboxMessage.Status.FAILED)
    url = f"{MESSAGES}{message.pk}/{suffix}"
    assert client_for(make_user(*VIEW_PERMISSIONS)).post(url, {}, format="json").status_code == 403
    response = client_for(make_user(*VIEW_PERMISSIONS, permission)).post(url, {}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == status
    assert (response.json()["discarded_at"] is not None) is discarded
    entry = OperatorAction.objects.get()
    assert (entry.model, entry.changed, entry.object_ids) == (
        "inbox.InboxMessage",
        1,
        [str(message.pk)],
    )


def test_inbox_discard_keeps_the_row_and_only_a_replay_brings_it_back(operator, make_message):
    message = make_message(InboxMessage.Status.FAILED)
    client = client_for(operator)
    assert client.post(f"{MESSAGES}{message.pk}/discard/", {}, format="json").status_code == 200
    again = client.post(f"{MESSAGES}{message.pk}/discard/", {}, format="json")
    assert again.status_code == 409
    assert "already discarded" in again.json()["message"]
    assert client.get(MESSAGES, {"discarded": "true"}).json()["results"][0]["id"] == message.pk
    assert client.get(MESSAGES, {"discarded": "false"}).json()["results"] == []

    body = {"ids": [message.pk], "reason": "after the fix"}
    retried = client.post(f"{MESSAGES}bulk/retry/", body, format="json").json()
    assert retried["changed"] == 0
    refused = client.post(f"{MESSAGES}{message.pk}/retry/", {}, format="json")
    assert refused.status_code == 409
    assert "was discarded; replay it" in refused.json()["message"]
    message.refresh_from_db()
    assert (message.status, message.discarded_at is not None) == ("FAILED", True)

    replayed = client.post(f"{MESSAGES}{message.pk}/replay/", {}, format="json").json()
    assert (replayed["status"], replayed["discarded_at"]) == ("PENDING", None)


def test_inbox_discard_of_a_done_message_is_a_409(operator, make_message):
    message = make_message(InboxMessage.Status.DONE)
    response = client_for(operator).post(f"{MESSAGES}{message.pk}/discard/", {}, format="json")
    assert response.status_code == 409
    assert "Only FAILED messages can be discarded" in response.json()["message"]
    message.refresh_from_db()
    assert message.discarded_at is None


def test_inbox_replay_of_a_done_message_is_a_409(operator, make_message):
    message = make_message(InboxMessage.Status.DONE)
    response = client_for(operator).post(f"{MESSAGES}{message.pk}/replay/", {}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "invalid_transition"


def test_a_dry_run_counts_no_further_than_an_action_may_take(operator, make_message, settings):
    settings.CONSOLE_BULK_MAX_ROWS = 2
    for _ in range(3):
        make_message(InboxMessage.Status.FAILED)
    client = client_for(operator)
    body = {"filter": {"status": "FAILED"}, "dry_run": True}
    with CaptureQueriesContext(connection) as queries:
        response = client.post(f"{MESSAGES}bulk/retry/", body, format="json")
    # Refused as the action itself would be, having counted three rows at most.
    assert response.status_code == 400
    assert response.json()["code"] == "bulk_too_large"
    counts = [query["sql"] for query in queries.captured_queries if "COUNT(" in query["sql"]]
    assert counts
    assert all("LIMIT 3" in sql for sql in counts)
    settings.CONSOLE_BULK_MAX_ROWS = 3
    assert client.post(f"{MESSAGES}bulk/retry/", body, format="json").json()["matched"] == 3


def test_inbox_bulk_dry_run_and_run(operator, make_message):
    for _ in range(2):
        make_message(InboxMessage.Status.FAILED, group="shipping")
    make_message(InboxMessage.Status.FAILED, group="billing")
    client = client_for(operator)
    body = {"filter": {"status": "FAILED", "consumer_group": "shipping"}}
    dry = client.post(f"{MESSAGES}bulk/retry/", {**body, "dry_run": True}, format="json").json()
    assert dry["matched"] == 2
    done = client.post(
        f"{MESSAGES}bulk/retry/", {**body, "reason": "shipping fixed"}, format="json"
    ).json()
    assert done["changed"] == 2
    assert InboxMessage.objects.filter(status="FAILED").count() == 1


def test_inbox_bulk_discard_by_filter_touches_only_failed_rows(operator, make_message):
    failed = [make_message(InboxMessage.Status.FAILED, group="shipping") for _ in range(2)]
    done = make_message(InboxMessage.Status.DONE, group="shipping")
    body = {"filter": {"consumer_group": "shipping"}, "reason": "obsolete"}
    result = client_for(operator).post(f"{MESSAGES}bulk/discard/", body, format="json").json()
    assert (result["matched"], result["changed"]) == (3, 2)
    discarded = InboxMessage.objects.filter(discarded_at__isnull=False)
    assert sorted(discarded.values_list("pk", flat=True)) == sorted(m.pk for m in failed)
    done.refresh_from_db()
    assert done.discarded_at is None


# --- stats and docs ---------------------------------------------------------------------------


def test_stats_summary(viewer, make_event, make_message):
    make_event(OutboxEvent.Status.FAILED, error="MSG_SIZE_TOO_LARGE: Broker: Message too large")
    make_event(OutboxEvent.Status.DONE)
    make_message(InboxMessage.Status.FAILED)
    body = client_for(viewer).get("/api/stats/summary/").json()
    assert body["outbox"]["counts"] == {"PENDING": 0, "FAILED": 1, "DONE": 1}
    assert body["inbox"]["counts"]["FAILED"] == 1
    classes = {(row["side"], row["error_class"]) for row in body["failures_by_error_class"]}
    assert ("outbox", "MSG_SIZE_TOO_LARGE") in classes
    assert ("inbox", "demo.errors.DemoFailure") in classes
    assert sum(body["rates_last_hour"]["published"]) == 1


def test_the_outbox_counts_of_the_summary_are_read_at_most_once_a_cache_period(
    viewer, make_event, settings
):
    settings.CONSOLE_DASHBOARD_CACHE_SECONDS = 10
    client = client_for(viewer)
    make_event(OutboxEvent.Status.FAILED, key="cached-1")
    assert client.get("/api/stats/summary/").json()["outbox"]["counts"]["FAILED"] == 1
    make_event(OutboxEvent.Status.FAILED, key="cached-2")
    assert client.get("/api/stats/summary/").json()["outbox"]["counts"]["FAILED"] == 1
    cache.clear()  # the period is over
    assert client.get("/api/stats/summary/").json()["outbox"]["counts"]["FAILED"] == 2


def test_consumer_lag_reports_an_unreachable_kafka_as_a_state(viewer, settings):
    settings.KAFKA_EVENTS = {**settings.KAFKA_EVENTS, "BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    settings.CONSOLE_KAFKA_TIMEOUT_SECONDS = 0.5
    settings.CONSOLE_CONSUMER_GROUPS = ["billing"]
    response = client_for(viewer).get("/api/stats/consumer-lag/")
    assert response.status_code == 200
    assert response.json()["reachable"] is False
    assert "Kafka unreachable" in response.json()["error"]


def test_schema_and_swagger_ui_are_served_locally(viewer):
    client = client_for(viewer)
    schema = client.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert "/api/outbox/events/bulk/retry/" in paths
    assert "/api/inbox/messages/{id}/replay/" in paths
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html
    # Every script, style sheet and image comes from this server (the page's own CSRF token,
    # random text, may contain any letters: only the addresses it loads are looked at).
    addresses = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    assert any("swagger-ui" in address for address in addresses)
    assert [a for a in addresses if re.match(r"(?:[a-z]+:)?//", a, re.IGNORECASE)] == []


def test_users_without_staff_still_need_permissions(db):
    user = User.objects.create_user(username="plain", password="pw")
    assert client_for(user).get(MESSAGES).status_code == 403


# A bulk action's reason, required of every one that changes rows.
WHY = {"reason": "incident 42"}
# Every action endpoint: (url of the row or the collection, the permission it needs, the row
# it acts on, the body). Refused anonymously, 403 with every permission but its own, 200 with it.
ACTION_MATRIX = [
    ("outbox-bulk-retry", "outbox.retry_outboxevent", {"filter": {"status": "FAILED"}, **WHY}),
    ("outbox-bulk-discard", "outbox.discard_outboxevent", {"filter": {"status": "FAILED"}, **WHY}),
    ("outbox-bulk-replay", "outbox.replay_outboxevent", {"filter": {"status": "DONE"}, **WHY}),
    ("outbox-key-release", "outbox.release_outboxkey", {"topic": "console.orders"}),
    ("inbox-retry", "inbox.retry_inboxmessage", {}),
    ("inbox-replay", "inbox.replay_inboxmessage", {}),
    ("inbox-discard", "inbox.discard_inboxmessage", {}),
    ("inbox-bulk-retry", "inbox.retry_inboxmessage", {"filter": {"status": "FAILED"}, **WHY}),
    ("inbox-bulk-replay", "inbox.replay_inboxmessage", {"filter": {"status": "FAILED"}, **WHY}),
    ("inbox-bulk-discard", "inbox.discard_inboxmessage", {"filter": {"status": "FAILED"}, **WHY}),
]


def _action_target(name, make_event, make_message):
    """The url of `name` and a row in the state its action changes."""
    if name.startswith("outbox"):
        status = OutboxEvent.Status.DONE if name.endswith("replay") else OutboxEvent.Status.FAILED
        event = make_event(status, key="k-1")
        return {"outbox-key-release": f"{EVENTS}keys/release/"}.get(
            name, f"{EVENTS}bulk/{name.rsplit('-', 1)[1]}/"
        ), {"key": event.key}
    message = make_message(InboxMessage.Status.FAILED)
    verb = name.rsplit("-", 1)[1]
    return (f"{MESSAGES}bulk/{verb}/" if "bulk" in name else f"{MESSAGES}{message.pk}/{verb}/"), {}


@pytest.mark.parametrize(("name", "permission", "body"), ACTION_MATRIX)
def test_every_action_endpoint_needs_its_own_permission(
    api, make_user, make_event, make_message, name, permission, body
):
    from tests.console.conftest import ACTION_PERMISSIONS

    url, extra = _action_target(name, make_event, make_message)
    body = {**body, **extra}
    anonymous = api.post(url, body, format="json")
    assert anonymous.status_code in (401, 403)
    others = [p for p in ACTION_PERMISSIONS if p != permission]
    refused = client_for(make_user(*VIEW_PERMISSIONS, *others)).post(url, body, format="json")
    assert refused.status_code == 403, refused.json()
    assert refused.json()["code"] == "permission_denied"
    assert not OperatorAction.objects.exists()
    allowed = client_for(make_user(*VIEW_PERMISSIONS, permission)).post(url, body, format="json")
    assert allowed.status_code == 200, allowed.json()
    entry = OperatorAction.objects.get()
    assert entry.source == "api"
    assert entry.changed == 1


@pytest.mark.parametrize(
    ("url", "permissions"),
    [
        ("/api/stats/summary/", ["outbox.view_outboxevent", "inbox.view_inboxmessage"]),
        ("/api/stats/consumer-lag/", ["inbox.view_inboxmessage"]),
    ],
)
def test_stats_need_the_view_permissions(make_user, url, permissions):
    assert client_for(make_user()).get(url).status_code == 403
    assert client_for(make_user(*permissions)).get(url).status_code == 200


def test_reading_one_row_needs_authentication(api, make_event, make_message):
    assert api.get(f"{EVENTS}{make_event().pk}/").status_code in (401, 403)
    assert api.get(f"{MESSAGES}{make_message().pk}/").status_code in (401, 403)


def test_an_empty_id_list_is_refused(operator):
    for url in (f"{EVENTS}bulk/retry/", f"{MESSAGES}bulk/retry/"):
        response = client_for(operator).post(url, {"ids": []}, format="json")
        assert response.status_code == 400
        assert response.json()["code"] == "validation_error"
        assert "ids" in response.json()["message"]


def test_an_unknown_api_path_is_a_json_404(operator):
    response = client_for(operator).get("/api/outbox/nothing-here/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
