"""The console's API, metrics and health answer under any prefix a project mounts them at
(tests/console/prefixed_urls.py: "ops/"), and its admin pages are on Django's default admin
site, wherever the project mounts that."""

import json

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from console.api.middleware import is_api_path
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from tests.console.conftest import client_for, deliver, logged_in

pytestmark = pytest.mark.urls("tests.console.prefixed_urls")


def test_reverse_gives_the_prefixed_addresses():
    assert reverse("api-schema") == "/ops/api/schema/"
    assert reverse("outbox-event-list") == "/ops/api/outbox/events/"
    assert reverse("metrics") == "/ops/metrics"
    assert reverse("health") == "/ops/health/"
    assert is_api_path("/ops/api/outbox/events/")
    assert not is_api_path("/api/outbox/events/")


def test_the_schema_and_an_api_call_answer_under_the_prefix(viewer, make_event):
    event = make_event()
    client = client_for(viewer)
    schema = client.get("/ops/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert "/ops/api/outbox/events/bulk/retry/" in paths
    assert not [path for path in paths if not path.startswith("/ops/api/")]
    listing = client.get("/ops/api/outbox/events/")
    assert listing.status_code == 200
    assert str(event.pk) in listing.content.decode()
    # Nothing is left at the addresses this repository's own project uses.
    assert client.get("/api/outbox/events/").status_code == 404


def test_the_api_guards_follow_the_prefix(operator, settings):
    client = client_for(operator)
    missing = client.get("/ops/api/outbox/nothing-here/")
    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"
    assert "/ops/api/docs/ lists them" in missing.json()["message"]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = json.dumps({"ids": ["x" * 2000]})
    too_large = client.post(
        "/ops/api/outbox/events/bulk/retry/", body, content_type="application/json"
    )
    assert too_large.status_code == 400
    assert too_large.json()["code"] == "request_too_large"


def test_the_admin_pages_are_on_the_default_admin_site(admin_user):
    assert admin.site.is_registered(OutboxEvent)
    assert admin.site.is_registered(InboxMessage)
    client = Client()
    client.force_login(admin_user)
    assert client.get(reverse("admin:outbox_outboxevent_changelist")).status_code == 200


def event_page_with_more_attempts_than_shown(admin_user, make_event, monkeypatch) -> tuple:
    """The admin page of an event with three attempts, of which it shows two."""
    monkeypatch.setattr("console.admin.outbox.ATTEMPTS_SHOWN", 2)
    event = make_event()
    for _ in range(3):
        deliver(event, "FAILED", error="MSG_TIMED_OUT: Local: Message timed out")
    page = logged_in(admin_user).get(reverse("admin:outbox_outboxevent_change", args=[event.pk]))
    assert page.status_code == 200
    return event, page.content.decode()


def test_the_admin_points_to_the_attempts_under_the_prefix(admin_user, make_event, monkeypatch):
    event, page = event_page_with_more_attempts_than_shown(admin_user, make_event, monkeypatch)
    assert (
        f"Only the first 2 attempts are shown; the API's /ops/api/outbox/events/{event.pk}"
        "/attempts/ lists them all." in page
    )


@pytest.mark.urls("tests.console.admin_only_urls")
def test_the_admin_pages_work_without_the_api(admin_user, make_event, monkeypatch):
    _, page = event_page_with_more_attempts_than_shown(admin_user, make_event, monkeypatch)
    assert "Only the first 2 attempts are shown.</p>" in page
