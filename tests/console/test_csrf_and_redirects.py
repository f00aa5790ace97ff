"""Cross-site request forgery and open redirects, with Django's test client enforcing CSRF as a
browser's requests meet it (docs/security.md).

Every state-changing admin request is found, not listed by hand: for every ModelAdmin on the
admin site, each of its list actions, each URL it adds (Unfold's list, row and detail actions,
the console's own views) and its add, change and delete views where a superuser may use them.
A POST of each without the CSRF token, by a logged-in superuser whose browser holds the CSRF
cookie, is refused with 403 and changes no row of any table, the audit log included.

The login page's `next` never sends the operator to another site."""

import re
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group, User
from django.db.models import Model
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from console.audit import operator_action_record
from console.models import BulkOperation, OperatorAction
from console.tokens import api_token_create
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from tests.analytics.results import result_run

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-enough-password"
KEY = "order-7"
GROUP = "billing"
TOPIC = "console.orders"
CSRF_REFUSAL = "CSRF verification failed"

# What a forged form would post: enough for each of the console's forms to act if the request
# got through (a confirmation's "post", a held key's coordinates, a bulk action's filter and
# reason, a new user's or group's fields).
FORGED_FIELDS = {
    "post": "yes",
    "note": "forged",
    "reason": "forged",
    "action": "inbox.retry_sequence",
    "consumer_group": GROUP,
    "topic": TOPIC,
    "key": KEY,
    "_changelist_filters": "status__exact=FAILED",
    "name": "forged",
    "username": "forged",
    "password1": "forged-password-1",
    "password2": "forged-password-1",
    "expires_in_days": "30",
    "scope": "all",
    "is_superuser": "on",
}


def _superuser_request() -> Any:
    """A request of an active superuser, not saved: what the admin offers such a user can be
    asked of its ModelAdmins before the test database exists."""
    request = RequestFactory().get("/admin/")
    request.user = User(username="enumerator", is_active=True, is_staff=True, is_superuser=True)
    return request


def _admin_prefix(model: type[Model]) -> str:
    return f"{reverse('admin:index')}{model._meta.app_label}/{model._meta.model_name}/"


def _standard_names(model: type[Model]) -> set[str]:
    prefix = f"{model._meta.app_label}_{model._meta.model_name}"
    return {f"{prefix}_{view}" for view in ("changelist", "add", "history", "delete", "change")}


@dataclass(frozen=True)
class Forgery:
    """One state-changing request of one ModelAdmin: a list action, one of its own URLs, or
    its add, change or delete view."""

    model: type[Model]
    kind: str
    name: str
    # The URL relative to the model's admin prefix; <object_id> (<id>) stands for a row's id.
    route: str

    def __str__(self) -> str:
        return f"{self.model._meta.label_lower}:{self.kind}:{self.name}"

    def request(self, row: Model | None) -> tuple[str, dict[str, Any]]:
        """The URL and the fields of the POST, aimed at `row` (for a list action, every row of
        the model is selected)."""
        data: dict[str, Any] = dict(FORGED_FIELDS)
        if self.kind == "action":
            data["action"] = self.name
            data["index"] = "0"
            data["_selected_action"] = [
                str(pk) for pk in self.model._default_manager.values_list("pk", flat=True)
            ]
        route = self.route
        for parameter in re.findall(r"<(?:\w+:)?(\w+)>", route):
            assert parameter in ("object_id", "id"), f"{self}: no value for <{parameter}>"
            assert row is not None, f"{self}: no row of {self.model} (create one in `rows`)"
            route = re.sub(rf"<(?:\w+:)?{parameter}>", quote(str(row.pk)), route)
        return _admin_prefix(self.model) + route, data


def _forgeries() -> list[Forgery]:
    request = _superuser_request()
    found = []
    for model, model_admin in admin.site._registry.items():
        for name in model_admin.get_actions(request):
            found.append(Forgery(model, "action", name, ""))
        standard = _standard_names(model)
        for pattern in model_admin.get_urls():
            route = str(pattern.pattern)
            # The catch-all that redirects an old change URL is a GET.
            if pattern.name in standard or (pattern.name is None and route == "<path:object_id>/"):
                continue
            found.append(Forgery(model, "url", pattern.name or route, route))
        if model_admin.has_add_permission(request):
            found.append(Forgery(model, "view", "add", "add/"))
        if model_admin.has_change_permission(request):
            found.append(Forgery(model, "view", "change", "<path:object_id>/change/"))
        if model_admin.has_delete_permission(request):
            found.append(Forgery(model, "view", "delete", "<path:object_id>/delete/"))
    return found


FORGERIES = _forgeries()


def _snapshot() -> dict[str, list[dict[str, Any]]]:
    """Every row of every table of every installed app: what a forged request must not change
    (events' delivery records and held sets, inbox rows, the audit log, users, tokens...)."""
    return {
        model._meta.label: list(model._default_manager.order_by("pk").values())
        for model in apps.get_models()
        if model._meta.managed and not model._meta.proxy
    }


@pytest.fixture
def superuser() -> User:
    return User.objects.create_superuser("admin", "admin@example.com", PASSWORD)


@pytest.fixture
def rows(superuser, make_event, make_message) -> dict[type[Model], Model]:
    """A row of every model on the admin site, each in a state its actions change: the row an
    object's URL is aimed at, by model."""
    failed_event = make_event(OutboxEvent.Status.FAILED, key=KEY, topic=TOPIC)
    make_event(OutboxEvent.Status.DONE)
    failed_message = make_message(
        InboxMessage.Status.FAILED, group=GROUP, topic=TOPIC, key=KEY, aggregate_id=KEY
    )
    make_message(InboxMessage.Status.DONE)
    result_run(since=timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3))
    entry = operator_action_record(
        user=superuser,
        action=OperatorAction.Action.OUTBOX_RETRY,
        model="outbox.OutboxEvent",
        source=OperatorAction.Source.ADMIN,
        requested=1,
    )
    # A bulk operation still queued, which a cancel would end.
    BulkOperation.objects.create(audit=entry, chunks_total=2)
    login = {
        "user_agent": "browser",
        "ip_address": "198.51.100.7",
        "username": "operator",
        "http_accept": "text/html",
        "path_info": "/admin/login/",
    }
    AccessAttempt.objects.create(**login, get_data="", post_data="", failures_since_start=9)
    AccessFailureLog.objects.create(**login, locked_out=True)
    AccessLog.objects.create(**login, session_hash="0" * 64)
    api_token_create(
        user=superuser, created_by=superuser, name="ci", expires_in=timedelta(days=1), actions=[]
    )
    Group.objects.create(name="operators")
    User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    interval = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    CrontabSchedule.objects.create(minute="5")
    SolarSchedule.objects.create(event="sunrise", latitude=52, longitude=13)
    ClockedSchedule.objects.create(clocked_time=timezone.now() + timedelta(days=1))
    PeriodicTask.objects.create(name="nightly", task="console.tasks.nothing", interval=interval)
    if apps.is_installed("demo"):
        payment = apps.get_model("demo", "Payment").objects.create(order_id="o-1", amount=5)
        apps.get_model("demo", "Delivery").objects.create(
            payment_id=payment.pk, order_id="o-1", event_id=str(uuid.uuid4())
        )
    targets: dict[type[Model], Model] = {OutboxEvent: failed_event, InboxMessage: failed_message}
    for model in admin.site._registry:
        if model not in targets:
            row = model._default_manager.order_by().first()
            if row is not None:
                targets[model] = row
    return targets


def _client_with_csrf_cookie(user: User) -> Client:
    """A logged-in browser that holds the CSRF cookie (a form of the admin set it), as the
    victim's of a forged cross-site POST would."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get(reverse("admin:password_change")).status_code == 200
    assert settings.CSRF_COOKIE_NAME in client.cookies
    return client


def test_every_state_changing_admin_request_is_found():
    """The enumeration finds the console's actions of every kind; a page added later is found
    the same way."""
    names = {str(forgery) for forgery in FORGERIES}
    for expected in (
        "outbox.outboxevent:action:retry_selected",
        "outbox.outboxevent:url:outbox_outboxevent_release_key",
        "outbox.outboxevent:url:outbox_outboxevent_retry_detail",
        "inbox.inboxmessage:url:inbox_inboxmessage_held_key_action",
        "analytics.analyticsrun:url:analytics_analyticsrun_run_now",
        "auth.user:action:delete_selected",
        "auth.user:view:delete",
    ):
        assert expected in names


@pytest.mark.parametrize("forgery", FORGERIES, ids=str)
def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(forgery, superuser, rows):
    client = _client_with_csrf_cookie(superuser)
    url, data = forgery.request(rows.get(forgery.model))
    before = _snapshot()
    response = client.post(url, data)
    assert response.status_code == 403
    # Refused for the token, before the view ran (not by the view for another reason).
    assert CSRF_REFUSAL in response.content.decode()
    assert _snapshot() == before


def test_the_same_post_with_the_token_goes_through(superuser, rows):
    """The check above can fail: the forged fields, posted with the token, do act (retry and
    delete selected rows, release a key), and the snapshot sees it."""
    client = _client_with_csrf_cookie(superuser)
    token = client.cookies[settings.CSRF_COOKIE_NAME].value
    by_name = {str(forgery): forgery for forgery in FORGERIES}
    for name in (
        "outbox.outboxevent:action:retry_selected",
        "outbox.outboxevent:url:outbox_outboxevent_release_key",
        "auth.group:action:delete_selected",
    ):
        forgery = by_name[name]
        url, data = forgery.request(rows.get(forgery.model))
        before = _snapshot()
        response = client.post(url, {**data, "csrfmiddlewaretoken": token})
        assert response.status_code == 302, (name, response.content[:300])
        assert _snapshot() != before, name
    assert not Group.objects.exists()
    assert OperatorAction.objects.filter(action=OperatorAction.Action.OUTBOX_RETRY).count() == 2


# --- the login page's `next` ------------------------------------------------------------------

OFF_SITE = [
    "https://evil.example/",
    "http://evil.example/admin/",
    "//evil.example",
    "///evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "/\\/evil.example",
    "http:evil.example",
    "https:/evil.example",
    "http:///evil.example",
    "\thttps://evil.example",
    " //evil.example",
    "/\t/evil.example",
    "https://testserver@evil.example/",
    "https://testserver.evil.example/",
    "javascript:alert(document.domain)",
    "data:text/html,<script>alert(1)</script>",
]


def _login(client: Client, *, query_next: str | None = None, form_next: str | None = None) -> Any:
    """Logs in through the login form (its token included), with `next` in the page's address
    (the form posts back to it) or in the form."""
    url = reverse("admin:login")
    if query_next is not None:
        url = f"{url}?{urlencode({'next': query_next})}"
    assert client.get(url).status_code == 200
    data = {
        "username": "admin",
        "password": PASSWORD,
        "csrfmiddlewaretoken": client.cookies[settings.CSRF_COOKIE_NAME].value,
    }
    if form_next is not None:
        data["next"] = form_next
    return client.post(url, data)


@pytest.mark.parametrize("where", ["address", "form"])
@pytest.mark.parametrize("target", OFF_SITE)
def test_a_login_never_redirects_off_site(superuser, target, where):
    client = Client(enforce_csrf_checks=True)
    if where == "address":
        response = _login(client, query_next=target)
    else:
        response = _login(client, form_next=target)
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:index")
    # Logged in all the same.
    assert client.get(reverse("admin:index")).status_code == 200


def test_a_login_follows_a_next_on_the_console(superuser):
    events = reverse("admin:outbox_outboxevent_changelist")
    response = _login(Client(enforce_csrf_checks=True), query_next=f"{events}?status__exact=FAILED")
    assert response.status_code == 302
    assert response["Location"] == f"{events}?status__exact=FAILED"


def test_a_login_without_next_lands_on_the_dashboard(superuser):
    response = _login(Client(enforce_csrf_checks=True))
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:index")


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example", "/\\evil.example"])
def test_a_logout_never_redirects_off_site(superuser, target):
    client = _client_with_csrf_cookie(superuser)
    response = client.post(
        f"{reverse('admin:logout')}?{urlencode({'next': target})}",
        {"csrfmiddlewaretoken": client.cookies[settings.CSRF_COOKIE_NAME].value},
    )
    assert response.status_code in (200, 302)
    if response.status_code == 302:
        assert response["Location"].startswith("/")
        assert not response["Location"].startswith(("//", "/\\"))
    # Logged out all the same.
    assert client.get(reverse("admin:index")).status_code == 302
