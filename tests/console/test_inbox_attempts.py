"""The inbox message's handler attempts in the console: the admin's timeline and
GET /api/inbox/messages/{id}/attempts/, on attempts the inbox services wrote."""

import json
import os
import re
import socket
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from inbox import handler
from inbox.models import InboxAttempt, InboxMessage
from inbox.records import parse_record
from inbox.registry import scoped_registry
from inbox.services.recording import inbox_message_record_batch
from inbox.services.retries import inbox_message_retry
from tests.console.conftest import attempt_rows, client_for
from tests.inbox.factories import Event

API = "/api/inbox/messages/"
GROUP = "billing"
PROCESS = f"{socket.gethostname()}:{os.getpid()}"
FIELDS = {
    "id",
    "attempted_at",
    "duration_ms",
    "outcome",
    "error_class",
    "error",
    "member",
    "partition",
    "offset",
    "handler",
}


class LedgerLocked(Exception):
    pass


@pytest.fixture
def flaky(db: Any) -> InboxMessage:
    """A message whose handler failed twice (the consumer's run, then the retry task's) and
    then succeeded (the retry task's)."""
    runs = {"count": 0}
    with scoped_registry():

        @handler(event_type="OrderPlaced", topic="console.orders", group=GROUP)
        def book(message: InboxMessage) -> None:
            runs["count"] += 1
            if runs["count"] <= 2:
                raise LedgerLocked(f"ledger locked <run {runs['count']}>")

        event = Event()
        record = parse_record(event.message(topic="console.orders", partition=3, offset=41))
        with transaction.atomic():
            inbox_message_record_batch(group=GROUP, records=[record], member="member-7")
        message = InboxMessage.objects.get(event_id=event.event_id)
        for _ in range(2):
            InboxMessage.objects.filter(pk=message.pk).update(next_attempt_at=timezone.now())
            inbox_message_retry(message_id=message.pk)
    message.refresh_from_db()
    assert message.status == InboxMessage.Status.DONE
    return message


@pytest.mark.django_db
def test_the_api_lists_a_message_s_attempts_oldest_first(viewer, flaky, make_message, make_user):
    client = client_for(viewer)
    body = client.get(f"{API}{flaky.pk}/attempts/").json()
    rows = body["results"]
    assert [(r["outcome"], r["error_class"]) for r in rows] == [
        ("FAILED", f"{__name__}.LedgerLocked"),
        ("FAILED", f"{__name__}.LedgerLocked"),
        ("DONE", ""),
    ]
    assert set(rows[0]) == FIELDS
    assert [r["member"] for r in rows] == [
        "member-7",
        f"retry-task@{PROCESS}",
        f"retry-task@{PROCESS}",
    ]
    assert {(r["partition"], r["offset"]) for r in rows} == {(3, 41)}
    assert "ledger locked <run 1>" in rows[0]["error"]
    assert rows[0]["attempted_at"] < rows[1]["attempted_at"] < rows[2]["attempted_at"]
    # No payload in an attempt.
    assert "payload" not in json.dumps(rows)

    # Paginated like the other lists: a cursor, no count.
    seen, url = [], f"{API}{flaky.pk}/attempts/?page_size=2"
    while url:
        page = client.get(url).json()
        assert "count" not in page
        seen.extend(row["id"] for row in page["results"])
        url = page["next"]
    assert seen == sorted(seen) == [r["id"] for r in rows]

    assert client.get(f"{API}{make_message().pk}/attempts/").json()["results"] == []
    missing = client.get(f"{API}999999999/attempts/")
    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"
    assert client.get(f"{API}nope/attempts/").json()["code"] == "invalid_id"
    assert client_for(make_user()).get(f"{API}{flaky.pk}/attempts/").status_code == 403


@pytest.mark.django_db
def test_the_schema_documents_the_attempts_endpoint(viewer):
    schema = json.loads(client_for(viewer).get("/api/schema/", {"format": "json"}).content)
    operation = schema["paths"]["/api/inbox/messages/{id}/attempts/"]["get"]
    assert {"200", "400", "403", "404"} <= set(operation["responses"])
    reference = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    page = schema["components"]["schemas"][reference.rsplit("/", 1)[1]]
    assert "next" in page["properties"]
    item = page["properties"]["results"]["items"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][item]["properties"]) == FIELDS
    assert {p["name"] for p in operation["parameters"]} >= {"cursor", "page_size"}


def _page(user: Any, message: InboxMessage) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/admin/inbox/inboxmessage/{message.pk}/change/")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_the_admin_shows_the_attempts_as_a_timeline(viewer, flaky):
    page = _page(viewer, flaky)
    assert "Handler attempts, oldest first" in page
    table = page[page.index("console-attempts") :]
    table = table[: table.index("</table>")]
    attempts = InboxAttempt.objects.filter(message_id=flaky.pk).order_by("id")
    # Each attempt to the millisecond, in UTC, in order.
    stamps = re.findall(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", table)
    assert stamps == [a.attempted_at.isoformat(timespec="milliseconds") for a in attempts]
    assert re.findall(r">(DONE|FAILED)<", table) == ["FAILED", "FAILED", "DONE"]
    assert [(row["Duration"], row["Error class"]) for row in attempt_rows(page)] == [
        (f"{a.duration_ms:.1f} ms", a.error_class or "-") for a in attempts
    ]
    failed_class = f"{__name__}.LedgerLocked"
    assert [row["Error class"] for row in attempt_rows(page)] == [failed_class] * 2 + ["-"]
    assert table.count(f"retry-task@{PROCESS}") == 2
    assert ">member-7<" in table
    assert "partition 3, offset 41" in table
    # The error escaped, like last_error.
    assert "ledger locked &lt;run 1&gt;" in table
    assert "counted, not listed" not in page


@pytest.mark.django_db
def test_attempts_before_the_upgrade_are_counted_not_listed(viewer, make_message):
    # A message recorded before attempt rows existed: 8 attempts counted, none listed.
    page = _page(viewer, make_message(InboxMessage.Status.FAILED))
    assert "No attempt yet." in page
    assert "8 earlier attempt(s) of this message are counted, not listed" in page
    assert "No attempt yet." in _page(viewer, make_message(InboxMessage.Status.PARKED, attempts=0))


@pytest.mark.django_db
def test_the_admin_points_to_the_api_beyond_the_attempts_it_shows(viewer, flaky, monkeypatch):
    monkeypatch.setattr("console.admin.inbox.ATTEMPTS_SHOWN", 2)
    page = _page(viewer, flaky)
    assert (
        f"Only the first 2 attempts are shown; the API's /api/inbox/messages/{flaky.pk}"
        "/attempts/ lists them all." in page
    )
    assert "counted, not listed" not in page
