"""API tokens (console.tokens, console.admin.tokens, console.models.ApiToken): hashed at rest,
so no column of the database authenticates; expiring; revocable in the admin; scoped on top
of the user's permissions; created and revoked in the admin, the token shown once; and the
move of DRF's plain-text tokens (migration 0004). Against the real database and API URLs."""

import importlib
import re
import secrets
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.models import ApiToken, OperatorAction
from console.operations import NotPermitted
from console.tokens import InvalidApiToken, api_token_create, api_token_revoke
from inbox.models import InboxMessage
from outbox.models import OutboxDelivery, OutboxEvent, OutboxEventPermission, OutboxHeldEvent
from tests.console.conftest import VIEW_PERMISSIONS

pytestmark = pytest.mark.django_db

EVENTS = "/api/outbox/events/"
MESSAGES = "/api/inbox/messages/"
TOKENS = "/admin/console/apitoken/"
# Tables that hold API tokens, or held them in plain text before migration 0004.
TOKEN_TABLES = ("console_api_token", "authtoken_token", "knox_authtoken")
Action = OperatorAction.Action


def token_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def logged_in(user: User) -> Client:
    """A browser's session: CSRF is checked, so each POST carries the token of a page read."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def submit(client: Client, page: str, data: dict[str, Any], *, to: str | None = None) -> Any:
    """Reads `page`, then POSTs `data` with the page's CSRF token to `to` (the page itself)."""
    html = client.get(page).content.decode()
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match is not None, html[:2000]
    return client.post(to or page, {"csrfmiddlewaretoken": match.group(1), **data})


def create_token(user: User, *, actions: list[str], created_by: User | None = None) -> str:
    _, text = api_token_create(
        user=user,
        created_by=created_by or User.objects.create_superuser(f"admin-{uuid.uuid4().hex[:6]}"),
        name="test",
        expires_in=timedelta(days=1),
        actions=actions,
    )
    return text


def shown_token(response: Any) -> str:
    """The token on the page the admin answers the creation form with."""
    match = re.search(r'id="api-token"[^>]*\bvalue="([^"]*)"', response.content.decode())
    assert match is not None, response.content.decode()[:2000]
    return match.group(1)


def admin_create(client: Client, **fields: Any) -> Any:
    data = {"name": "CI deploy", "expires_in_days": "30", "scope": "read_only", **fields}
    return submit(client, f"{TOKENS}add/", data)


def stored_texts(tables: tuple[str, ...] = TOKEN_TABLES) -> list[str]:
    """Every non-null value of every column of every row of `tables`, as text, read with SQL
    (what a database dump holds)."""
    values: list[str] = []
    existing = set(connection.introspection.table_names())
    with connection.cursor() as cursor:
        for table in tables:
            if table not in existing:
                continue
            cursor.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
                [table],
            )
            columns = [row[0] for row in cursor.fetchall()]
            assert columns
            selected = ", ".join(f'"{column}"::text' for column in columns)
            cursor.execute(f'SELECT {selected} FROM "{table}"')
            values.extend(value for row in cursor.fetchall() for value in row if value is not None)
    return values


# --- hashed at rest ---------------------------------------------------------------------------


def test_a_database_dump_holds_no_usable_token(operator, make_event):
    make_event()
    admin_user = User.objects.create_superuser("root", password="pw")
    response = admin_create(logged_in(admin_user), user=str(operator.pk), scope="all_actions")
    assert response.status_code == 200
    shown = [
        shown_token(response),
        create_token(operator, actions=[]),
        create_token(operator, actions=[OutboxEventPermission.RETRY]),
    ]
    assert ApiToken.objects.count() == 3
    for token in shown:
        assert token_client(token).get(EVENTS).status_code == 200

    values = stored_texts()
    assert len(values) >= 3 * 7  # every column of the three rows
    candidates: set[str] = set()
    for value in values:
        candidates.update(value[:length] for length in range(1, len(value) + 1))
        candidates.update(re.findall(r"[A-Za-z0-9_]+", value))
    for candidate in sorted(candidates):
        response = token_client(candidate).get(EVENTS)
        assert response.status_code == 401, (candidate, response.status_code)
        assert response.json()["code"] == "authentication_failed"

    # Neither a token nor its random part (after the prefix "console_") is in any column.
    for token in shown:
        secret_part = token.removeprefix("console_")
        assert len(secret_part) == 64
        assert not [value for value in values if secret_part in value]
    # The tokens still work: the dump was read, nothing was changed.
    assert token_client(shown[0]).get(EVENTS).status_code == 200


# --- expiry and revocation --------------------------------------------------------------------


def test_an_expired_token_gets_401(viewer, make_event):
    make_event()
    token = create_token(viewer, actions=[])
    client = token_client(token)
    assert client.get(EVENTS).status_code == 200
    ApiToken.objects.filter(user=viewer).update(expiry=timezone.now() - timedelta(seconds=1))
    response = client.get(EVENTS)
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"
    assert response.json()["message"]


def test_a_token_revoked_in_the_admin_gets_401(viewer, make_event):
    make_event()
    token = create_token(viewer, actions=[])
    other = create_token(viewer, actions=[])
    client = token_client(token)
    assert client.get(EVENTS).status_code == 200
    row = ApiToken.objects.get(token_key=token[:15])
    admin_user = User.objects.create_superuser("root", password="pw")
    response = submit(
        logged_in(admin_user), TOKENS, {"action": "revoke_selected", "_selected_action": [row.pk]}
    )
    assert response.status_code == 302
    response = client.get(EVENTS)
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"
    # Only the chosen token is revoked, and the revocation is audited.
    assert token_client(other).get(EVENTS).status_code == 200
    entry = OperatorAction.objects.get(action=Action.TOKEN_REVOKE)
    assert (entry.username, entry.source, entry.requested, entry.changed) == ("root", "admin", 1, 1)
    assert entry.object_ids == [token[:15]]


# --- scope ------------------------------------------------------------------------------------


def rows_snapshot() -> tuple[list[Any], ...]:
    """What an operator action could change: outbox events (a replay adds one), their delivery
    records and held set, and the inbox messages."""
    return (
        list(OutboxEvent.objects.order_by("id").values_list("id", flat=True)),
        list(OutboxDelivery.objects.order_by("id").values_list("id", "outcome")),
        list(
            OutboxHeldEvent.objects.order_by("id").values_list(
                "event_id", "attempts", "next_attempt_at"
            )
        ),
        list(
            InboxMessage.objects.order_by("id").values_list(
                "id", "status", "attempts", "next_attempt_at", "discarded_at"
            )
        ),
    )


# (name, builds the url and body from a FAILED event, a DONE event and a FAILED message)
ACTION_REQUESTS = [
    ("outbox retry", lambda failed, done, message: (f"{EVENTS}{failed.pk}/retry/", {})),
    ("outbox discard", lambda failed, done, message: (f"{EVENTS}{failed.pk}/discard/", {})),
    (
        "outbox replay",
        lambda failed, done, message: (f"{EVENTS}{done.pk}/replay/", {"new_event_id": True}),
    ),
    (
        "outbox bulk retry",
        lambda failed, done, message: (
            f"{EVENTS}bulk/retry/",
            {"ids": [str(failed.pk)], "reason": "why"},
        ),
    ),
    (
        "outbox bulk discard",
        lambda failed, done, message: (
            f"{EVENTS}bulk/discard/",
            {"ids": [str(failed.pk)], "reason": "why"},
        ),
    ),
    (
        "outbox bulk replay",
        lambda failed, done, message: (
            f"{EVENTS}bulk/replay/",
            {"filter": {"status": "DONE"}, "reason": "why"},
        ),
    ),
    ("inbox retry", lambda failed, done, message: (f"{MESSAGES}{message.pk}/retry/", {})),
    ("inbox discard", lambda failed, done, message: (f"{MESSAGES}{message.pk}/discard/", {})),
    ("inbox replay", lambda failed, done, message: (f"{MESSAGES}{message.pk}/replay/", {})),
    (
        "inbox bulk retry",
        lambda failed, done, message: (
            f"{MESSAGES}bulk/retry/",
            {"ids": [message.pk], "reason": "why"},
        ),
    ),
    (
        "inbox bulk discard",
        lambda failed, done, message: (
            f"{MESSAGES}bulk/discard/",
            {"ids": [message.pk], "reason": "why"},
        ),
    ),
    (
        "inbox bulk replay",
        lambda failed, done, message: (
            f"{MESSAGES}bulk/replay/",
            {"filter": {"status": "FAILED"}, "reason": "why"},
        ),
    ),
]


@pytest.mark.parametrize(
    ("name", "request_for"), ACTION_REQUESTS, ids=[n for n, _ in ACTION_REQUESTS]
)
def test_a_read_only_token_cannot_act_even_for_a_user_with_every_permission(
    operator, make_event, make_message, name, request_for
):
    failed = make_event(OutboxEvent.Status.FAILED)
    done = make_event(OutboxEvent.Status.DONE)
    message = make_message(InboxMessage.Status.FAILED)
    url, body = request_for(failed, done, message)
    client = token_client(create_token(operator, actions=[]))
    assert client.get(EVENTS).status_code == 200
    assert client.get(MESSAGES).status_code == 200
    before = rows_snapshot()
    audit_before = OperatorAction.objects.count()

    response = client.post(url, body, format="json")

    assert response.status_code == 403, response.json()
    assert response.json()["code"] == "permission_denied"
    assert rows_snapshot() == before
    assert OperatorAction.objects.count() == audit_before
    # The user may do it: through the session, the same request changes the row.
    session = APIClient()
    session.force_authenticate(operator)
    assert session.post(url, body, format="json").status_code == 200
    assert rows_snapshot() != before


def test_a_token_scoped_to_outbox_retry_retries_but_cannot_discard(operator, make_event):
    client = token_client(create_token(operator, actions=[OutboxEventPermission.RETRY]))
    retried = make_event(OutboxEvent.Status.FAILED)
    response = client.post(f"{EVENTS}{retried.pk}/retry/", {}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "PENDING"
    bulk = make_event(OutboxEvent.Status.FAILED)
    response = client.post(
        f"{EVENTS}bulk/retry/", {"ids": [str(bulk.pk)], "reason": "why"}, format="json"
    )
    assert (response.status_code, response.json()["changed"]) == (200, 1)
    assert OperatorAction.objects.filter(action=Action.OUTBOX_RETRY).count() == 2

    kept = make_event(OutboxEvent.Status.FAILED)
    before = rows_snapshot()
    for url, body in (
        (f"{EVENTS}{kept.pk}/discard/", {}),
        (f"{EVENTS}bulk/discard/", {"ids": [str(kept.pk)], "reason": "why"}),
        (f"{EVENTS}{kept.pk}/replay/", {}),
    ):
        response = client.post(url, body, format="json")
        assert response.status_code == 403, url
        assert response.json()["code"] == "permission_denied"
    assert rows_snapshot() == before
    assert not OperatorAction.objects.filter(action=Action.OUTBOX_DISCARD).exists()


def test_a_token_with_all_actions_of_a_viewer_cannot_retry(viewer, make_event):
    event = make_event(OutboxEvent.Status.FAILED)
    client = token_client(create_token(viewer, actions=[ApiToken.ALL_ACTIONS]))
    assert client.get(EVENTS).status_code == 200
    before = rows_snapshot()
    for url, body in (
        (f"{EVENTS}{event.pk}/retry/", {}),
        (f"{EVENTS}bulk/retry/", {"ids": [str(event.pk)], "reason": "why"}),
    ):
        response = client.post(url, body, format="json")
        assert response.status_code == 403
        assert response.json()["code"] == "permission_denied"
    assert rows_snapshot() == before
    assert not OperatorAction.objects.exclude(action=Action.TOKEN_CREATE).exists()


def test_a_scope_never_grants_a_permission_other_than_reading_and_the_actions():
    token = ApiToken(name="t", actions=[ApiToken.ALL_ACTIONS])
    assert token.allows(["outbox.view_outboxevent", OutboxEventPermission.DISCARD])
    assert not token.allows(["console.add_apitoken"])
    assert not token.allows(["console.unlock_login"])
    assert not ApiToken(name="t", actions=[]).allows([OutboxEventPermission.RETRY])


# --- the service ------------------------------------------------------------------------------


def test_the_service_refuses_tokens_for_others_long_lives_and_unknown_actions(make_user):
    creator = make_user("console.add_apitoken")
    other = make_user()
    with pytest.raises(NotPermitted):
        api_token_create(
            user=other, created_by=creator, name="x", expires_in=timedelta(days=1), actions=[]
        )
    with pytest.raises(NotPermitted):
        api_token_create(
            user=other, created_by=other, name="x", expires_in=timedelta(days=1), actions=[]
        )
    for expires_in, actions in (
        (timedelta(days=366), []),
        (timedelta(0), []),
        (timedelta(days=1), ["console.add_apitoken"]),
        (timedelta(days=1), [ApiToken.ALL_ACTIONS, OutboxEventPermission.RETRY]),
    ):
        with pytest.raises(InvalidApiToken):
            api_token_create(
                user=creator, created_by=creator, name="x", expires_in=expires_in, actions=actions
            )
    assert not ApiToken.objects.exists()
    assert not OperatorAction.objects.exists()
    token, _ = api_token_create(
        user=creator, created_by=creator, name="mine", expires_in=None, actions=[]
    )
    assert token.expiry is not None
    assert abs(token.expiry - (timezone.now() + timedelta(days=90))) < timedelta(minutes=1)
    with pytest.raises(NotPermitted):
        api_token_revoke(tokens=[token], revoked_by=creator, source="admin")
    assert ApiToken.objects.filter(pk=token.pk).exists()


# --- migration 0004 ---------------------------------------------------------------------------


def test_migration_0004_moves_plain_tokens_to_digests(viewer, make_event):
    make_event()
    key = secrets.token_hex(20)
    created = timezone.now() - timedelta(days=400)
    migration = importlib.import_module("console.migrations.0004_hash_plain_api_tokens")
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created timestamptz NOT NULL, user_id integer NOT NULL)"
        )
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
                [key, created, viewer.pk],
            )
        assert token_client(key).get(EVENTS).status_code == 401  # not yet moved

        with connection.schema_editor() as schema_editor:
            migration.hash_plain_api_tokens(apps, schema_editor)

        assert token_client(key).get(EVENTS).status_code == 200
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM authtoken_token")
            assert cursor.fetchone()[0] == 0
        values = stored_texts()
        assert values
        assert not [value for value in values if key in value]
        moved = ApiToken.objects.get()
        assert moved.user == viewer
        assert moved.created == created
        assert moved.actions == [ApiToken.ALL_ACTIONS]
        assert moved.expiry is not None
        assert moved.expiry > timezone.now() + timedelta(days=89)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS authtoken_token")


# --- the admin --------------------------------------------------------------------------------


def test_the_admin_shows_a_new_token_once_and_audits_creation_and_revocation(operator, make_event):
    make_event()
    admin_user = User.objects.create_superuser("root", password="pw")
    client = logged_in(admin_user)
    assert client.get(f"{TOKENS}add/").status_code == 200

    response = admin_create(
        client,
        name="Grafana",
        user=str(operator.pk),
        scope="chosen",
        chosen_actions=[OutboxEventPermission.RETRY, OutboxEventPermission.DISCARD],
    )
    assert response.status_code == 200
    token = shown_token(response)
    html = response.content.decode()
    assert "cannot be shown again" in html
    assert "no-store" in response["Cache-Control"]
    assert token_client(token).get(EVENTS).status_code == 200
    row = ApiToken.objects.get()
    assert (row.name, row.user, row.token_key) == ("Grafana", operator, token[:15])
    assert row.actions == [OutboxEventPermission.RETRY, OutboxEventPermission.DISCARD]
    assert abs(row.expiry - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)

    # A second look: the list and the token's page show its prefix, never the token.
    listing = client.get(TOKENS).content.decode()
    page = client.get(f"{TOKENS}{row.pk}/change/")
    assert page.status_code == 200
    assert f"{token[:15]}..." in listing
    assert f"{token[:15]}..." in page.content.decode()
    for html in (listing, page.content.decode()):
        assert token not in html
        assert token[15:] not in html
    # Tokens are immutable: the page has no form to change one.
    assert submit(client, f"{TOKENS}{row.pk}/change/", {"name": "x"}).status_code == 403

    response = submit(client, f"{TOKENS}{row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not ApiToken.objects.exists()
    assert token_client(token).get(EVENTS).status_code == 401
    created = OperatorAction.objects.get(action=Action.TOKEN_CREATE)
    revoked = OperatorAction.objects.get(action=Action.TOKEN_REVOKE)
    for entry in (created, revoked):
        assert (entry.username, entry.source, entry.changed) == ("root", "admin", 1)
        assert entry.object_ids == [token[:15]]
        assert "Grafana" in entry.note
        assert token[15:] not in str(
            [getattr(entry, field.attname) for field in OperatorAction._meta.concrete_fields]
        )
    # Nor in the admin's own history of the token.
    assert not [value for value in stored_texts(("django_admin_log",)) if token[15:] in value]


def test_a_non_superuser_creates_tokens_only_for_themselves(make_user):
    creator = make_user(*VIEW_PERMISSIONS, "console.add_apitoken", "console.view_apitoken")
    other = make_user(*VIEW_PERMISSIONS)
    client = logged_in(creator)
    form = client.get(f"{TOKENS}add/").content.decode()
    assert other.username not in form

    response = admin_create(client, user=str(other.pk))
    assert response.status_code == 200
    assert 'id="api-token"' not in response.content.decode()
    assert "Select a valid choice" in response.content.decode()
    assert not ApiToken.objects.exists()
    assert not OperatorAction.objects.exists()

    response = admin_create(client, user=str(creator.pk))
    assert token_client(shown_token(response)).get(EVENTS).status_code == 200
    assert ApiToken.objects.get().user == creator


def test_the_admin_form_requires_an_expiry_within_a_year_and_notes_lacking_permissions(viewer):
    admin_user = User.objects.create_superuser("root", password="pw")
    client = logged_in(admin_user)
    for days in ("", "0", "366"):
        response = admin_create(client, user=str(viewer.pk), expires_in_days=days)
        assert 'id="api-token"' not in response.content.decode()
    response = admin_create(client, user=str(viewer.pk), scope="chosen")
    assert "Tick at least one action" in response.content.decode()
    assert not ApiToken.objects.exists()

    response = admin_create(
        client, user=str(viewer.pk), scope="chosen", chosen_actions=[OutboxEventPermission.RETRY]
    )
    shown_token(response)
    assert 'id="scope-note"' in response.content.decode()
    assert "outbox.retry_outboxevent" in response.content.decode()


def test_creating_and_revoking_in_the_admin_need_their_permissions(make_user, viewer):
    token = create_token(viewer, actions=[])
    row = ApiToken.objects.get()
    looker = logged_in(make_user("console.view_apitoken"))
    assert looker.get(TOKENS).status_code == 200
    assert looker.get(f"{TOKENS}add/").status_code == 403
    delete_url = f"{TOKENS}{row.pk}/delete/"
    assert submit(looker, TOKENS, {"post": "yes"}, to=delete_url).status_code == 403
    submit(looker, TOKENS, {"action": "revoke_selected", "_selected_action": [row.pk]})
    assert ApiToken.objects.exists()
    assert token_client(token).get(EVENTS).status_code == 200
