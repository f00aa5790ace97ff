"""The held keys of the inbox (order per key) in the console: the admin page and its actions,
the API, the gauges. Each action has its own permission and writes the audit log."""

import pytest
from django.test import Client

from console.models import OperatorAction
from inbox.models import InboxMessage
from tests.app_settings import override_app_settings
from tests.console.conftest import ACTION_PERMISSIONS, VIEW_PERMISSIONS, client_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ordered_billing")]

HELD_KEYS_API = "/api/inbox/held-keys/"
HELD_KEYS_ADMIN = "/admin/inbox/inboxmessage/held-keys/"
KEY = {"consumer_group": "billing", "topic": "console.orders", "key": "order-1"}
Status = InboxMessage.Status


@pytest.fixture
def ordered_billing():
    with override_app_settings("INBOX", ORDERING="none", GROUP_ORDERING={"billing": "key"}):
        yield


@pytest.fixture
def held(make_message):
    """A FAILED head on order-1 with two messages parked behind it, and a key of a group
    without order per key whose failed message holds nothing."""
    head = make_message(Status.FAILED)
    parked = [make_message(Status.PARKED, attempts=0) for _ in range(2)]
    make_message(Status.FAILED, group="unordered")
    return head, parked


@pytest.fixture
def logged_in(make_user):
    def log_in(*permissions: str) -> Client:
        client = Client()
        client.force_login(make_user(*permissions))
        return client

    return log_in


def test_the_api_lists_held_keys_with_their_head_and_parked_count(make_user, held):
    head, _ = held
    response = client_for(make_user(*VIEW_PERMISSIONS)).get(HELD_KEYS_API)
    assert response.status_code == 200, response.json()
    [key] = response.json()
    assert {k: key[k] for k in KEY} == KEY
    assert key["parked"] == 2
    assert key["head"]["id"] == head.pk
    assert key["head"]["status"] == "FAILED"
    assert key["head"]["last_error"].startswith("demo.errors.DemoFailure")
    filtered = client_for(make_user(*VIEW_PERMISSIONS)).get(
        HELD_KEYS_API, {"consumer_group": "other"}
    )
    assert filtered.json() == []


def test_listing_held_keys_needs_the_view_permission(make_user, held):
    assert client_for(make_user()).get(HELD_KEYS_API).status_code == 403


@pytest.mark.parametrize(
    ("path", "permission", "action"),
    [
        ("retry/", "inbox.retry_inboxsequence", "inbox.retry_sequence"),
        ("skip-head/", "inbox.skip_inboxsequencehead", "inbox.skip_head"),
        ("release/", "inbox.release_inboxkey", "inbox.release_key"),
    ],
)
def test_each_api_action_on_a_held_key_needs_its_own_permission_and_is_audited(
    make_user, held, path, permission, action
):
    head, _ = held
    body = {**KEY, "note": "paged at 3 a.m."}
    others = [p for p in ACTION_PERMISSIONS if p != permission]
    refused = client_for(make_user(*VIEW_PERMISSIONS, *others)).post(
        HELD_KEYS_API + path, body, format="json"
    )
    assert refused.status_code == 403
    assert refused.json()["code"] == "permission_denied"
    assert not OperatorAction.objects.exists()

    allowed = client_for(make_user(*VIEW_PERMISSIONS, permission)).post(
        HELD_KEYS_API + path, body, format="json"
    )
    assert allowed.status_code == 200, allowed.json()
    assert allowed.json()["head"]["id"] == head.pk
    entry = OperatorAction.objects.get()
    assert (entry.action, entry.source, entry.note) == (action, "api", "paged at 3 a.m.")
    assert entry.filters == KEY
    assert entry.object_ids == [str(head.pk)]
    head.refresh_from_db()
    if action == "inbox.retry_sequence":
        assert (head.status, head.attempts) == ("PENDING", 0)
    elif action == "inbox.skip_head":
        assert head.discarded_at is not None
    else:
        assert (head.status, head.released_at is not None) == ("FAILED", True)


def test_api_actions_on_a_key_that_is_not_held_are_a_conflict(make_user, held):
    operator = client_for(make_user(*VIEW_PERMISSIONS, "inbox.release_inboxkey"))
    missing = operator.post(HELD_KEYS_API + "release/", {**KEY, "key": "order-2"}, format="json")
    assert missing.status_code == 409
    assert missing.json()["code"] == "invalid_transition"
    unordered = operator.post(
        HELD_KEYS_API + "release/", {**KEY, "consumer_group": "unordered"}, format="json"
    )
    assert unordered.status_code == 409
    assert "ordering 'none'" in unordered.json()["message"]
    incomplete = operator.post(HELD_KEYS_API + "release/", {"topic": "t"}, format="json")
    assert incomplete.status_code == 400
    assert incomplete.json()["code"] == "validation_error"
    assert not OperatorAction.objects.exists()


def test_the_admin_page_lists_held_keys_and_offers_the_users_actions(held, logged_in):
    head, _ = held
    viewer = logged_in(*VIEW_PERMISSIONS)
    page = viewer.get(HELD_KEYS_ADMIN)
    assert page.status_code == 200
    text = page.content.decode()
    assert "order-1" in text
    assert f"/admin/inbox/inboxmessage/{head.pk}/change/" in text
    assert "unordered" not in text
    assert "Skip the head" not in text  # a viewer has no action
    releaser = logged_in(*VIEW_PERMISSIONS, "inbox.release_inboxkey")
    text = releaser.get(HELD_KEYS_ADMIN).content.decode()
    assert "Release a held key" in text
    assert "Skip the head" not in text


def test_an_admin_action_is_confirmed_then_run_and_audited(held, logged_in):
    head, _ = held
    url = HELD_KEYS_ADMIN + "act/"
    skipper = logged_in(*VIEW_PERMISSIONS, "inbox.skip_inboxsequencehead")
    confirm = skipper.get(url, {**KEY, "action": "inbox.skip_head"})
    assert confirm.status_code == 200
    assert "2 parked behind it" in confirm.content.decode()
    assert not OperatorAction.objects.exists()
    done = skipper.post(url, {**KEY, "action": "inbox.skip_head", "note": "bad payload"})
    assert done.status_code == 302
    head.refresh_from_db()
    assert head.discarded_at is not None
    entry = OperatorAction.objects.get()
    assert (entry.action, entry.source, entry.note) == ("inbox.skip_head", "admin", "bad payload")
    # Another user without the permission: refused, nothing done.
    refused = logged_in(*VIEW_PERMISSIONS, "inbox.release_inboxkey").post(
        url, {**KEY, "action": "inbox.skip_head"}
    )
    assert refused.status_code == 403
    assert OperatorAction.objects.count() == 1


def test_the_gauges_count_held_keys_and_parked_messages_per_group(held):
    text = Client().get("/metrics").content.decode()
    assert 'inbox_held_keys{group="billing"} 1.0' in text
    assert 'inbox_parked_messages{group="billing"} 2.0' in text
    assert 'group="unordered"' not in text
    assert 'inbox_messages{status="PARKED"} 2.0' in text
