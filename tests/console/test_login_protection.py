"""Login protection (django-axes) through the admin's one login page, against the real
PostgreSQL: lock-outs by user name and by address, their end after the cool-off, the lock-out
page, the console's lock-out pages and their audited unlock, and the client address that
failures are counted against (console.security)."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.db.models import F
from django.test import Client, RequestFactory
from django.utils import timezone

from console.logins import login_lockout_unlock, login_lockouts_with_state
from console.models import LoginLockout, OperatorAction
from console.operations import NotPermitted
from console.security import login_client_address
from tests.console.conftest import logged_in

LOGIN = "/admin/login/"
LOCKOUTS = "/admin/console/loginlockout/"
FAILED_LOGINS = "/admin/console/failedlogin/"
LOGINS = "/admin/console/login/"
LIMIT = 3
PASSWORD = "pw"  # the password tests.console.conftest.make_user gives every user
LOCKOUT_VIEWER = ("console.view_loginlockout",)
UNLOCKER = ("console.view_loginlockout", "console.unlock_login")
LOG_VIEWER = ("console.view_failedlogin", "console.view_login")


@pytest.fixture(autouse=True)
def _small_failure_limit(settings):
    # The cool-off (15 minutes) and the trusted proxies (none) are the project's defaults.
    settings.AXES_FAILURE_LIMIT = LIMIT


def from_address(address: str) -> Client:
    return Client(REMOTE_ADDR=address)


def log_in(client: Client, username: str, password: str, **headers):
    """The login form posted as a browser does (Client.login() gives axes no request)."""
    return client.post(
        LOGIN, {"username": username, "password": password, "next": "/admin/"}, **headers
    )


def is_logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def fail(client: Client, username: str, times: int = 1, **headers) -> list[int]:
    return [log_in(client, username, "wrong", **headers).status_code for _ in range(times)]


def assert_locked_out_page(response, settings) -> None:
    assert response.status_code == 429
    assert "admin/console/login_locked_out.html" in [t.name for t in response.templates]
    html = " ".join(response.content.decode().split())
    assert f"after {LIMIT} failed attempts" in html
    minutes = round(settings.AXES_COOLOFF_TIME.total_seconds() / 60)
    assert "Login locked" in html
    assert f"Try again {minutes} minutes after the failed attempt that locked it" in html
    assert "permission to unlock logins" in html


# --- lock-outs -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_right_password_is_refused_after_the_failure_limit(make_user, settings):
    make_user(username="alice")
    client = from_address("10.1.0.1")

    # Below the limit a failure answers the login form again; the limit-th locks out.
    assert fail(client, "alice", LIMIT) == [200] * (LIMIT - 1) + [429]
    assert AccessFailureLog.objects.filter(username="alice", ip_address="10.1.0.1").count() == 3
    assert AccessAttempt.objects.get(username="alice").failures_since_start == LIMIT

    response = log_in(client, "alice", PASSWORD)
    assert_locked_out_page(response, settings)
    assert "alice" in response.content.decode()
    assert not is_logged_in(client)
    # The user name is locked from any address, not only the one that failed.
    elsewhere = from_address("10.1.0.2")
    assert log_in(elsewhere, "alice", PASSWORD).status_code == 429
    assert not is_logged_in(elsewhere)
    assert not AccessLog.objects.filter(username="alice").exists()


@pytest.mark.django_db
def test_failures_under_the_limit_do_not_lock_out(make_user):
    make_user(username="bob")
    client = from_address("10.1.1.1")
    assert fail(client, "bob", LIMIT - 1) == [200] * (LIMIT - 1)
    response = log_in(client, "bob", PASSWORD)
    assert response.status_code == 302
    assert is_logged_in(client)
    login = AccessLog.objects.get(username="bob")
    assert login.ip_address == "10.1.1.1"


@pytest.mark.django_db
def test_failures_over_several_user_names_lock_out_their_address(make_user, settings):
    make_user(username="carol")
    attacker = from_address("10.2.0.1")
    statuses = [log_in(attacker, f"guess-{number}", "wrong").status_code for number in range(3)]
    assert statuses == [200, 200, 429]
    assert AccessAttempt.objects.filter(ip_address="10.2.0.1").count() == 3

    # Another user name from the locked address is refused, even with its right password...
    same_address = from_address("10.2.0.1")
    assert_locked_out_page(log_in(same_address, "carol", PASSWORD), settings)
    assert not is_logged_in(same_address)
    # ...while that user logs in from elsewhere: the address is locked, not the user name.
    elsewhere = from_address("10.2.0.2")
    assert log_in(elsewhere, "carol", PASSWORD).status_code == 302
    assert is_logged_in(elsewhere)


@pytest.mark.django_db
def test_attempts_during_a_lock_out_do_not_extend_it(make_user, settings):
    make_user(username="erin")
    client = from_address("10.3.1.1")
    fail(client, "erin", LIMIT)
    cool_off = settings.AXES_COOLOFF_TIME
    # Halfway through the lock-out, more guesses are refused...
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - cool_off / 2)
    assert log_in(client, "erin", "wrong").status_code == 429
    assert log_in(client, "erin", PASSWORD).status_code == 429
    # ...and the lock-out still ends a cool-off after the failure that locked it.
    AccessAttempt.objects.update(
        attempt_time=F("attempt_time") - cool_off / 2 - timedelta(seconds=1)
    )
    assert log_in(client, "erin", PASSWORD).status_code == 302
    assert is_logged_in(client)


@pytest.mark.django_db
def test_the_lock_out_ends_with_the_cool_off(make_user, settings):
    make_user(username="dave")
    client = from_address("10.3.0.1")
    fail(client, "dave", LIMIT)

    cool_off = settings.AXES_COOLOFF_TIME
    # A minute before the cool-off ends the lock-out still holds...
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - cool_off + timedelta(minutes=1))
    assert log_in(client, "dave", PASSWORD).status_code == 429
    assert not is_logged_in(client)

    # ...and once every counted failure is older than the cool-off, the password works.
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - cool_off - timedelta(seconds=1))
    lockout = login_lockouts_with_state(LoginLockout.objects.filter(username="dave")).get()
    assert not lockout.locked_now
    response = log_in(client, "dave", PASSWORD)
    assert response.status_code == 302
    assert is_logged_in(client)


@pytest.mark.django_db
def test_locked_until_is_when_the_failures_within_the_cool_off_fall_under_the_limit(settings):
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)
    now = timezone.now()

    def attempt(username: str, address: str, failures: int, minutes_ago: int) -> AccessAttempt:
        row = AccessAttempt.objects.create(
            username=username,
            ip_address=address,
            user_agent="test",
            failures_since_start=failures,
            get_data="",
            post_data="",
            http_accept="*/*",
            path_info=LOGIN,
        )
        # attempt_time is auto_now_add: set afterwards.
        AccessAttempt.objects.filter(pk=row.pk).update(
            attempt_time=now - timedelta(minutes=minutes_ago)
        )
        return row

    # erin: 2 failures from one address 10 minutes ago, 1 from another 2 minutes ago. The
    # limit (3) is reached counting back to the older row: locked until it is 15 minutes old.
    older = attempt("erin", "10.6.0.1", failures=2, minutes_ago=10)
    newer = attempt("erin", "10.6.0.2", failures=1, minutes_ago=2)
    # frank: 5 failures, but 20 minutes ago, past the cool-off.
    stale = attempt("frank", "10.6.0.3", failures=5, minutes_ago=20)
    # gina: 2 failures only.
    under = attempt("gina", "10.6.0.4", failures=2, minutes_ago=1)

    rows = {row.pk: row for row in login_lockouts_with_state(LoginLockout.objects.all(), now=now)}
    for row in (older, newer):
        assert rows[row.pk].locked_now
        assert rows[row.pk].locked_until == now + timedelta(minutes=5)
    for row in (stale, under):
        assert not rows[row.pk].locked_now
        assert rows[row.pk].locked_until is None


@pytest.mark.django_db
def test_the_first_failure_is_the_first_the_row_counts(make_user):
    client = from_address("10.6.1.1")
    fail(client, "pia", 2)
    logged = list(AccessFailureLog.objects.order_by("attempt_time"))

    def first_failure():
        rows = login_lockouts_with_state(LoginLockout.objects.filter(username="pia"))
        return rows.get().first_failure

    assert first_failure() == logged[0].attempt_time
    # After an unlock the count starts again; the failures before it stay in the log.
    login_lockout_unlock(
        user=make_user(*UNLOCKER), attempt_ids=[LoginLockout.objects.get().pk], source="admin"
    )
    fail(client, "pia", 1)
    newest = AccessFailureLog.objects.latest("attempt_time")
    assert AccessFailureLog.objects.count() == 3
    assert first_failure() == newest.attempt_time


# --- the client address ----------------------------------------------------------------------


def _request(remote: str, forwarded: str | None = None):
    request = RequestFactory().post(LOGIN, REMOTE_ADDR=remote)
    if forwarded is not None:
        request.META["HTTP_X_FORWARDED_FOR"] = forwarded
    return request


def test_without_trusted_proxies_the_address_is_the_connections(settings):
    assert settings.LOGIN_TRUSTED_PROXY_COUNT == 0, "the default"
    assert login_client_address(_request("192.0.2.10", "203.0.113.7")) == "192.0.2.10"
    assert login_client_address(_request("192.0.2.10")) == "192.0.2.10"


@pytest.mark.parametrize(
    ("trusted", "forwarded", "expected"),
    [
        # The one proxy appended the address it saw: the last entry.
        (1, "203.0.113.7", "203.0.113.7"),
        (1, "198.51.100.66, 203.0.113.7", "203.0.113.7"),
        # Two proxies: the outer one appended the client's, the inner one the outer proxy's.
        (2, "198.51.100.66, 203.0.113.7, 10.0.0.2", "203.0.113.7"),
        (2, "203.0.113.7,10.0.0.2", "203.0.113.7"),
    ],
)
def test_behind_trusted_proxies_the_address_is_the_one_the_outermost_saw(
    settings, trusted, forwarded, expected
):
    settings.LOGIN_TRUSTED_PROXY_COUNT = trusted
    assert login_client_address(_request("10.0.0.1", forwarded)) == expected


@pytest.mark.parametrize(("trusted", "forwarded"), [(1, None), (1, ""), (2, "203.0.113.7")])
def test_a_header_with_fewer_entries_than_proxies_falls_back_to_the_connection(
    settings, trusted, forwarded
):
    settings.LOGIN_TRUSTED_PROXY_COUNT = trusted
    assert login_client_address(_request("10.0.0.1", forwarded)) == "10.0.0.1"


@pytest.mark.parametrize("entry", ["203.0.113.9:4431", "unknown", "[2001:db8::1]"])
def test_an_entry_that_is_no_address_falls_back_to_the_connection(settings, entry):
    settings.LOGIN_TRUSTED_PROXY_COUNT = 1
    assert login_client_address(_request("10.0.0.1", f"198.51.100.7, {entry}")) == "10.0.0.1"


@pytest.mark.django_db
def test_a_forged_forwarded_header_does_not_escape_an_address_lock_out(make_user, settings):
    assert settings.LOGIN_TRUSTED_PROXY_COUNT == 0, "the default"
    make_user(username="hank")
    attacker = from_address("10.5.0.1")
    statuses = [
        log_in(
            attacker, f"guess-{number}", "wrong", HTTP_X_FORWARDED_FOR=f"198.51.100.{number}"
        ).status_code
        for number in range(LIMIT)
    ]
    assert statuses == [200] * (LIMIT - 1) + [429]
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"10.5.0.1"}

    response = log_in(attacker, "hank", PASSWORD, HTTP_X_FORWARDED_FOR="198.51.100.99")
    assert response.status_code == 429
    assert not is_logged_in(attacker)


# --- the console's pages and the unlock ------------------------------------------------------


def _post_unlock(client: Client, ids: list[int]):
    return client.post(
        LOCKOUTS,
        {"action": "unlock_selected", "index": "0", "_selected_action": [str(i) for i in ids]},
    )


@pytest.mark.django_db
def test_an_operator_unlocks_a_locked_out_login_and_it_is_audited(make_user):
    make_user(username="ivy")
    client = from_address("10.4.0.1")
    fail(client, "ivy", LIMIT)
    fail(from_address("10.9.0.1"), "someone-else", 1)
    locked = AccessAttempt.objects.get(username="ivy")
    unrelated = AccessAttempt.objects.get(username="someone-else")

    operator = logged_in(make_user(*UNLOCKER, username="security-ops"))
    page = operator.get(LOCKOUTS)
    assert page.status_code == 200
    assert 'value="unlock_selected"' in page.content.decode()

    response = _post_unlock(operator, [locked.pk])
    assert response.status_code == 302
    messages = [str(m) for m in operator.get(LOCKOUTS).context["messages"]]
    assert any("ivy" in message and "Failure counts cleared: 1" in message for message in messages)

    assert log_in(client, "ivy", PASSWORD).status_code == 302
    assert is_logged_in(client)
    # Only the unlocked user name's and address's failures were cleared.
    assert list(AccessAttempt.objects.values_list("pk", flat=True)) == [unrelated.pk]
    entry = OperatorAction.objects.get()
    assert entry.action == OperatorAction.Action.LOGIN_UNLOCK
    assert (entry.username, entry.source) == ("security-ops", "admin")
    assert entry.model == "axes.AccessAttempt"
    assert (entry.requested, entry.changed) == (1, 1)
    assert entry.object_ids == [str(locked.pk)]
    assert "ivy" in entry.note
    assert "10.4.0.1" in entry.note


@pytest.mark.django_db
def test_unlocking_an_address_clears_the_user_names_tried_from_it(make_user):
    make_user(username="jack")
    attacker = from_address("10.4.1.1")
    for number in range(LIMIT):
        log_in(attacker, f"guess-{number}", "wrong")
    rows = list(AccessAttempt.objects.order_by("pk").values_list("pk", flat=True))

    operator = logged_in(make_user(*UNLOCKER, username="security-ops"))
    _post_unlock(operator, [rows[0]])

    assert log_in(from_address("10.4.1.1"), "jack", PASSWORD).status_code == 302
    entry = OperatorAction.objects.get()
    assert entry.object_ids == [str(pk) for pk in rows]
    assert (entry.requested, entry.changed) == (1, LIMIT)


@pytest.mark.django_db
def test_without_the_unlock_permission_the_action_is_hidden_and_refused(make_user):
    make_user(username="kate")
    client = from_address("10.4.2.1")
    fail(client, "kate", LIMIT)
    locked = AccessAttempt.objects.get(username="kate")

    viewer = logged_in(make_user(*LOCKOUT_VIEWER, username="viewer"))
    page = viewer.get(LOCKOUTS)
    assert page.status_code == 200
    assert "kate" in page.content.decode()
    assert "unlock_selected" not in page.content.decode()

    _post_unlock(viewer, [locked.pk])
    assert viewer.post(f"{LOCKOUTS}{locked.pk}/unlock/").status_code == 403
    assert viewer.get(f"{LOCKOUTS}{locked.pk}/unlock/").status_code == 403

    assert AccessAttempt.objects.filter(pk=locked.pk).exists()
    assert not OperatorAction.objects.exists()
    assert log_in(client, "kate", PASSWORD).status_code == 429
    assert not is_logged_in(client)


@pytest.mark.django_db
def test_the_unlock_service_refuses_an_operator_without_the_permission(make_user):
    fail(from_address("10.4.4.1"), "quinn", LIMIT)
    locked = LoginLockout.objects.get()
    with pytest.raises(NotPermitted):
        login_lockout_unlock(user=make_user(*LOCKOUT_VIEWER), attempt_ids=[locked.pk], source="api")
    assert LoginLockout.objects.filter(pk=locked.pk).exists()
    assert not OperatorAction.objects.exists()


@pytest.mark.django_db
def test_the_detail_page_unlocks_after_a_confirmation(make_user):
    make_user(username="liam")
    client = from_address("10.4.3.1")
    fail(client, "liam", LIMIT)
    locked = AccessAttempt.objects.get(username="liam")
    operator = logged_in(make_user(*UNLOCKER, username="security-ops"))

    detail = operator.get(f"{LOCKOUTS}{locked.pk}/change/")
    assert detail.status_code == 200
    assert f"{LOCKOUTS}{locked.pk}/unlock/" in detail.content.decode()

    confirm = operator.get(f"{LOCKOUTS}{locked.pk}/unlock/")
    assert confirm.status_code == 200
    assert "locked until" in confirm.content.decode()
    assert AccessAttempt.objects.filter(pk=locked.pk).exists(), "a GET must not unlock"

    response = operator.post(f"{LOCKOUTS}{locked.pk}/unlock/")
    assert response.status_code == 302
    assert response.url == LOCKOUTS
    assert not AccessAttempt.objects.exists()
    assert OperatorAction.objects.get().object_ids == [str(locked.pk)]
    assert log_in(client, "liam", PASSWORD).status_code == 302


@pytest.mark.django_db
def test_the_lock_out_list_filters_by_state_and_searches(make_user):
    fail(from_address("10.7.0.1"), "mia", LIMIT)
    fail(from_address("10.7.0.2"), "noah", 1)
    viewer = logged_in(make_user(*LOCKOUT_VIEWER))

    def shown(**query) -> set[str]:
        response = viewer.get(LOCKOUTS, query)
        assert response.status_code == 200
        return {row.username for row in response.context["cl"].result_list}

    assert shown() == {"mia", "noah"}
    assert shown(locked_now="yes") == {"mia"}
    assert shown(locked_now="no") == {"noah"}
    assert shown(q="noah") == {"noah"}
    assert shown(q="10.7.0.1") == {"mia"}


@pytest.mark.django_db
def test_the_lock_out_and_login_pages_render_with_the_view_permission(make_user):
    make_user(username="olga")
    client = from_address("10.8.0.1")
    fail(client, "olga", 1)
    log_in(client, "olga", PASSWORD)
    lockout = LoginLockout.objects.get()
    failure = AccessFailureLog.objects.get()
    login = AccessLog.objects.get()

    everything = logged_in(make_user(*LOCKOUT_VIEWER, *LOG_VIEWER))
    for url, text in (
        (LOCKOUTS, "olga"),
        (f"{LOCKOUTS}{lockout.pk}/change/", "10.8.0.1"),
        (FAILED_LOGINS, "Failed logins"),
        (f"{FAILED_LOGINS}{failure.pk}/change/", "olga"),
        (LOGINS, "Logins"),
        (f"{LOGINS}{login.pk}/change/", "olga"),
    ):
        response = everything.get(url)
        assert response.status_code == 200, url
        assert text in response.content.decode(), url
    searched = everything.get(FAILED_LOGINS, {"q": "10.8.0.1"}).context["cl"].result_list
    assert {row.username for row in searched} == {"olga"}

    nothing = logged_in(make_user())
    for url in (LOCKOUTS, FAILED_LOGINS, LOGINS, f"{LOCKOUTS}{lockout.pk}/change/"):
        assert nothing.get(url).status_code == 403, url
