"""The console's sessions and response headers: a login starts a new session, a logout ends it
for good, cookies keep out of scripts, and every page carries the Content-Security-Policy
(docs/security.md)."""

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from outbox.models import OutboxEvent
from outbox.selectors import outbox_events_with_delivery

ADMIN_INDEX = "/admin/"
LOGIN = "/admin/login/"
LOGOUT = "/admin/logout/"
PASSWORD = "a-long-enough-password"


@pytest.fixture
def staff_member(db) -> User:
    return User.objects.create_user("staff-member", password=PASSWORD, is_staff=True)


def log_in(client: Client) -> None:
    response = client.post(LOGIN, {"username": "staff-member", "password": PASSWORD})
    assert response.status_code == 302, response.content[:500]


def test_a_login_replaces_the_session_a_visitor_had(staff_member):
    client = Client()
    client.get(LOGIN)
    client.session.save()
    before = client.cookies[settings.SESSION_COOKIE_NAME].value
    log_in(client)
    after = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert after != before
    # The old session id no longer opens the console.
    stale = Client()
    stale.cookies[settings.SESSION_COOKIE_NAME] = before
    assert stale.get(ADMIN_INDEX).status_code == 302


def test_a_logout_ends_the_session_on_the_server(staff_member):
    client = Client()
    log_in(client)
    session_id = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert client.get(ADMIN_INDEX).status_code == 200
    assert client.post(LOGOUT).status_code == 200
    replayed = Client()
    replayed.cookies[settings.SESSION_COOKIE_NAME] = session_id
    response = replayed.get(ADMIN_INDEX)
    assert response.status_code == 302
    assert response["Location"].startswith(LOGIN)


def test_session_and_csrf_cookies_are_kept_from_scripts_and_other_sites(staff_member):
    client = Client()
    log_in(client)
    session_cookie = client.cookies[settings.SESSION_COOKIE_NAME]
    assert session_cookie["httponly"]
    assert session_cookie["samesite"] == "Lax"
    assert int(session_cookie["max-age"]) == settings.SESSION_COOKIE_AGE <= 12 * 60 * 60


def test_every_page_carries_the_policy(staff_member):
    client = Client()
    log_in(client)
    policy = client.get(ADMIN_INDEX)["Content-Security-Policy"]
    directives = {part.split()[0]: part.split()[1:] for part in policy.split(";") if part.strip()}
    assert directives["default-src"] == ["'self'"]
    assert directives["object-src"] == ["'none'"]
    assert directives["frame-ancestors"] == ["'none'"]
    assert directives["base-uri"] == ["'self'"]
    # Inline scripts run only with the response's nonce (django-csp adds it when a page uses it).
    assert "'unsafe-inline'" not in directives["script-src"]


def test_responses_forbid_sniffing_and_framing(staff_member):
    client = Client()
    response = client.get(LOGIN)
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert "Content-Security-Policy" in response


def test_a_password_change_ends_the_users_other_sessions(staff_member):
    elsewhere = Client()
    log_in(elsewhere)
    assert elsewhere.get(ADMIN_INDEX).status_code == 200
    staff_member.set_password("another-long-enough-password")
    staff_member.save()
    assert elsewhere.get(ADMIN_INDEX).status_code == 302


def test_passwords_shorter_than_twelve_characters_are_refused(staff_member):
    with pytest.raises(ValidationError, match="at least 12 characters"):
        validate_password("k7#Lq9!mZ2x", user=staff_member)
    validate_password("k7#Lq9!mZ2xW", user=staff_member)


def test_an_api_action_with_a_session_needs_the_csrf_token(operator, make_event):
    event = make_event(OutboxEvent.Status.FAILED)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(f"/api/outbox/events/{event.pk}/retry/", {}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["message"]
    unchanged = outbox_events_with_delivery(OutboxEvent.objects.all()).get(pk=event.pk)
    assert unchanged.delivery_status == OutboxEvent.Status.FAILED
