"""The console in headless Chromium under its Content-Security-Policy (docs/security.md): every
page works with no violation of the policy (Alpine.js menus open, charts are drawn, Swagger UI
starts), an inline script without the response's nonce is blocked and reported, and text that
services publish (payloads, keys, headers, event types, errors, undecodable records) is shown
as text on every page that shows it, with the policy and without it."""

from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.test import RequestFactory
from django.urls import path, reverse
from django.utils import timezone

import outbox
from analytics.models import ReconciliationFinding
from console.bulk_operations import bulk_action_run
from console.models import OperatorAction
from inbox import handler
from inbox.models import InboxMessage
from inbox.records import parse_record
from inbox.registry import scoped_registry
from inbox.services.recording import inbox_message_record_batch
from outbox.models import OutboxEvent
from project import urls as project_urls
from tests.analytics.results import result_run
from tests.console.conftest import deliver, hold
from tests.e2e.conftest import assert_no_violations, log_in, needs_browser, page_report
from tests.inbox.factories import Event

# The dashboard reads consumer lag and health from the broker.
pytestmark = [pytest.mark.kafka, needs_browser]

PASSWORD = "e2e-password"
TOPIC = "console.orders"
GROUP = "billing"

# Text a publishing service controls, each piece aimed at one way out of HTML escaping: an
# element, an attribute, the end of a script, a link, template syntax (Django's, JavaScript's),
# Alpine.js directives, a JavaScript string, a dialog.
SCRIPT = "<script>window.__xss=1</script>"
ATTRIBUTE = '"><img src=x onerror="window.__xss=1">'
SCRIPT_END = "</script><script>window.__xss=1</script>"
LINK = "javascript:window.__xss=1"
TEMPLATE = "{{7*7}} ${7*7}"
ALPINE = '<b x-data x-init="window.__xss=1">alpine</b>'
STRING_END = "');window.__xss=1;//"
DIALOG = "<svg/onload=alert('xss')>"

# Keys are shown, searched for and put in links to the pages that act on them.
OUTBOX_KEY = f"{LINK}/{SCRIPT_END}{STRING_END}"
INBOX_KEY = f"{LINK}/{ATTRIBUTE}{STRING_END}"
# The relay's error as the console shows it; the text before ':' is its class on the dashboard.
ERROR = f"{ATTRIBUTE}{SCRIPT}: {SCRIPT_END} {LINK} {TEMPLATE} {DIALOG}"
PAYLOAD = {
    "text": SCRIPT,
    "attribute": ATTRIBUTE,
    "link": LINK,
    "template": TEMPLATE,
    "alpine": ALPINE,
    "dialog": DIALOG,
}
NOTE = f"{SCRIPT} {ATTRIBUTE} {DIALOG}"
# A failed login's user name and browser, as the pages of failed logins show them.
LOGIN_NAME = f"{SCRIPT_END}{ALPINE}"
USER_AGENT = f"{DIALOG}{SCRIPT} agent"
# Not JSON: the inbox keeps these bytes in raw_value.
RAW_VALUE = f"{SCRIPT}{ATTRIBUTE}{LINK} not JSON".encode()
RAW_EVENT_ID = f"{ATTRIBUTE}-raw"

# What a page did that it must not: ran the planted code, holds an element or attribute the
# hostile text would have made, or links to a javascript: address.
INJECTED_SCRIPT = """
const linkAttributes = ["href", "src", "action", "formaction", "xlink:href"];
return {
    xss: window.__xss === undefined ? null : String(window.__xss),
    elements: [...document.querySelectorAll(
        'img[src="x"], [onerror], [onload], [x-init*="__xss"], svg[onload]'
    )].map((element) => element.outerHTML.slice(0, 200)),
    scripts: [...document.scripts]
        .filter((script) => script.text.includes("__xss"))
        .map((script) => script.outerHTML.slice(0, 200)),
    links: [...document.querySelectorAll("*")]
        .flatMap((element) => linkAttributes.map((name) => element.getAttribute(name) || ""))
        .filter((value) => /^\\s*javascript:/i.test(value)),
    text: document.body.innerText,
};
"""


def _canvases_drawn(browser: Any) -> list[bool]:
    """For each canvas of the page: whether Chart.js owns it and has painted a pixel."""
    return browser.execute_script(
        """
        return [...document.querySelectorAll("canvas")].map((canvas) => {
            const context = canvas.getContext("2d");
            const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
            return Boolean(window.Chart && Chart.getChart(canvas)) && pixels.some((v) => v !== 0);
        });
        """
    )


def _wait_for_text(browser: Any, selector: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 20).until(
        expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, selector), text)
    )


def _admin_pages(user: User) -> dict[str, str]:
    """Every page of every model registered in the console's admin that `user` may see: its
    list, its add form if allowed, and the page of one of its rows if it has any. Pages added
    to the console later are found here without a change to this test."""
    request = RequestFactory().get("/admin/")
    request.user = user
    pages = {}
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        name = f"{opts.app_label}.{opts.model_name}"
        if not model_admin.has_view_or_change_permission(request):
            continue
        pages[f"{name} list"] = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        if model_admin.has_add_permission(request):
            pages[f"{name} add"] = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
        row = model._default_manager.order_by().first()
        if row is not None:
            pages[f"{name} row"] = reverse(
                f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(row.pk)]
            )
    return pages


@pytest.fixture
def superuser(transactional_db: Any) -> User:
    cache.clear()  # no dashboard card cached by an earlier test
    return User.objects.create_superuser("admin", "admin@example.com", PASSWORD)


def _failed_outbox_event(**fields: Any) -> OutboxEvent:
    """An event whose attempts are spent, as the relay leaves it: its key is quarantined."""
    values: dict[str, Any] = {
        "aggregate_type": "order",
        "aggregate_id": "order-1",
        "event_type": "OrderPlaced",
        "payload": {"amount": "12.50"},
        "topic": TOPIC,
        **fields,
    }
    error = values.pop("error", "MSG_TIMED_OUT: Local: Message timed out")
    with transaction.atomic():
        event = outbox.publish(**values)
    event.refresh_from_db()
    for _ in range(2):
        deliver(event, "FAILED", error=error)
    hold(event, attempts=2, error=error)
    return event


def _published_outbox_event() -> OutboxEvent:
    with transaction.atomic():
        event = outbox.publish(
            aggregate_type="order",
            aggregate_id="order-2",
            event_type="OrderPlaced",
            payload={"amount": "3.00"},
            topic=TOPIC,
        )
    event.refresh_from_db()
    deliver(event, "PUBLISHED", kafka_partition=0, kafka_offset=7)
    return event


def _consume(
    events: list[Event], *, raw: Sequence[tuple[bytes, list[Any]]] = (), settings: Any
) -> None:
    """Records `events` (and `raw` records: value, headers) in GROUP as the consumer does,
    with a handler for every event type that fails with the event's payload in its error; one
    attempt each, so a message fails at once and holds its key."""
    settings.INBOX = {**settings.INBOX, "MAX_ATTEMPTS": 1}
    from confluent_kafka import Message

    messages = [event.message(topic=TOPIC, offset=offset) for offset, event in enumerate(events)]
    for value, headers in raw:
        messages.append(
            Message(
                topic=TOPIC,
                partition=0,
                offset=len(messages),
                key=None,
                value=value,
                headers=headers,
                timestamp=(1, int(timezone.now().timestamp() * 1000)),
            )
        )
    with scoped_registry():
        for event_type in {event.event_type for event in events}:

            @handler(event_type=event_type, topic=TOPIC, group=GROUP)
            def fail(message: InboxMessage) -> None:
                raise ValueError(f"cannot apply {message.payload}")

        with transaction.atomic():
            inbox_message_record_batch(
                group=GROUP, records=[parse_record(message) for message in messages]
            )


@pytest.mark.django_db(transaction=True)
def test_the_console_works_under_its_policy(live_server, browser, superuser, settings):
    """Every page of the console, the API's browsable pages and Swagger UI, with rows to show:
    no violation of the policy, no script error, and the scripts the pages need do their work."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    failed = _failed_outbox_event()
    _published_outbox_event()
    head, parked = Event(aggregate_id="order-9"), Event(aggregate_id="order-9")
    _consume([head, parked], settings=settings)
    message = InboxMessage.objects.get(event_id=head.event_id)
    audit = bulk_action_run(
        user=superuser,
        action=OperatorAction.Action.OUTBOX_RETRY,
        source="admin",
        ids=[failed.pk],
        reason="walk the pages",
    )
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    run = result_run(since=hour - timedelta(hours=3))

    log_in(browser, live_server.url, "admin", PASSWORD)
    browser.get_log("browser")  # the login's own requests are not a page of this test

    browser.get(f"{live_server.url}/admin/")
    report = page_report(browser)
    assert_no_violations(report, "dashboard")
    # The rate charts and the analytics charts: Chart.js ran and painted each canvas.
    drawn = _canvases_drawn(browser)
    assert len(drawn) >= 4
    assert all(drawn), drawn
    # Alpine.js evaluates the user menu's expressions: a click opens it.
    logout = browser.find_element(By.CSS_SELECTOR, "#logout-form button")
    assert not logout.is_displayed()
    browser.find_element(By.CSS_SELECTOR, "[x-data*=openUserLinks] > .cursor-pointer").click()
    WebDriverWait(browser, 10).until(expected_conditions.visibility_of(logout))
    assert_no_violations(page_report(browser), "dashboard, user menu open")

    pages = {
        "outbox list": ("/admin/outbox/outboxevent/", str(failed.pk)),
        "outbox detail": (f"/admin/outbox/outboxevent/{failed.pk}/change/", "MSG_TIMED_OUT"),
        "inbox list": ("/admin/inbox/inboxmessage/", head.event_id),
        "inbox detail": (f"/admin/inbox/inboxmessage/{message.pk}/change/", "cannot apply"),
        "held keys": ("/admin/inbox/inboxmessage/held-keys/", "order-9"),
        "audit log": ("/admin/console/operatoraction/", "admin"),
        "audit entry": (f"/admin/console/operatoraction/{audit.pk}/change/", str(failed.pk)),
        "analytics runs": ("/admin/analytics/analyticsrun/", "Succeeded"),
        "analytics run": (f"/admin/analytics/analyticsrun/{run.pk}/change/", "not_consumed"),
        "findings": ("/admin/analytics/reconciliationfinding/", "planted"),
        "API, browsable": ("/api/outbox/events/", str(failed.pk)),
    }
    for name, (url, expected) in pages.items():
        browser.get(live_server.url + url)
        report = page_report(browser)
        assert expected in browser.find_element(By.TAG_NAME, "body").text, name
        assert_no_violations(report, name)
    every_page = _admin_pages(superuser)
    assert {"outbox.outboxevent row", "inbox.inboxmessage row"} <= every_page.keys()
    for name, url in every_page.items():
        browser.get(live_server.url + url)
        assert_no_violations(page_report(browser), name)

    # Swagger UI: its start-up script, served from a URL, fetched the schema and rendered it.
    browser.get(f"{live_server.url}/api/docs/")
    try:
        _wait_for_text(browser, "#swagger-ui .info .title", "Event delivery console API")
        _wait_for_text(browser, "#swagger-ui", "/api/outbox/events/")
    except TimeoutException:
        pytest.fail(f"Swagger UI did not start: {page_report(browser)}")
    assert_no_violations(page_report(browser), "Swagger UI")

    # The login page, to a visitor without a session.
    browser.delete_all_cookies()
    browser.get(f"{live_server.url}/admin/login/")
    assert browser.find_elements(By.NAME, "password")
    assert_no_violations(page_report(browser), "login")


# A page of this test's own: the response's nonce lets one inline script run; an inline script
# without it, and an image from a data: address (only the API's documentation allows those),
# are refused and reported.
PROBE_PAGE = """<!DOCTYPE html>
<html><head><title>probe</title></head><body>
<script nonce="{{ CSP_NONCE }}">window.__withNonce = 1;</script>
<script>window.__withoutNonce = 1;</script>
<img alt="" src="data:image/gif;base64,R0lGODlhAQABAAAAACH5BAEKAAEALAAAAAABAAEAAAICTAEAOw==">
</body></html>"""


def _probe(request: HttpRequest) -> HttpResponse:
    return HttpResponse(engines["django"].from_string(PROBE_PAGE).render(request=request))


urlpatterns = [path("csp-probe/", _probe), *project_urls.urlpatterns]


@pytest.mark.django_db(transaction=True)
def test_an_inline_script_without_the_nonce_is_blocked_and_reported(live_server, browser, settings):
    """What the checks above rely on: the policy refuses what it must, and page_report sees it."""
    settings.ROOT_URLCONF = __name__
    browser.get(f"{live_server.url}/csp-probe/")
    report = page_report(browser)
    assert browser.execute_script("return window.__withNonce") == 1
    assert browser.execute_script("return window.__withoutNonce === undefined")
    refused = {(violation["directive"], violation["blocked"]) for violation in report["violations"]}
    assert refused == {("script-src-elem", "inline"), ("img-src", "data")}
    assert any("inline script" in message for message in report["console_csp"])


def _hostile_rows(superuser: User, settings: Any) -> dict[str, Any]:
    """Outbox events, inbox messages (one a record that is not JSON), an audit entry and an
    analytics finding, whose every text field a service could set holds hostile text."""
    event = _failed_outbox_event(
        aggregate_type=ATTRIBUTE,
        aggregate_id=OUTBOX_KEY,
        event_type=SCRIPT,
        payload=PAYLOAD,
        headers={"x-note": ATTRIBUTE, "x-link": LINK, "x-alpine": ALPINE},
        error=ERROR,
    )
    published = _published_outbox_event()
    head = Event(
        event_type=SCRIPT,
        aggregate_type=ATTRIBUTE,
        aggregate_id=INBOX_KEY,
        payload=PAYLOAD,
        extra_headers={"x-link": LINK, "x-alpine": ALPINE, "x-dialog": DIALOG},
    )
    parked = Event(event_type=SCRIPT, aggregate_id=INBOX_KEY, payload=PAYLOAD)
    raw_headers = [("event_id", RAW_EVENT_ID.encode()), ("event_type", TEMPLATE.encode())]
    _consume([head, parked], raw=[(RAW_VALUE, raw_headers)], settings=settings)
    audit = bulk_action_run(
        user=superuser,
        action=OperatorAction.Action.OUTBOX_RETRY,
        source="admin",
        ids=[published.pk],
        filters={"q": [OUTBOX_KEY], "event_type__exact": [TEMPLATE]},
        reason=NOTE,
    )
    run = result_run(since=timezone.now().replace(minute=0, second=0, microsecond=0))
    ReconciliationFinding.objects.create(
        run=run,
        kind=ReconciliationFinding.Kind.STUCK,
        event_id=str(event.pk),
        topic=TOPIC,
        event_type=SCRIPT,
        consumer_group=ATTRIBUTE,
        detail=f"{SCRIPT_END} {LINK} {DIALOG}",
    )
    return {
        "event": event,
        "message": InboxMessage.objects.get(event_id=head.event_id),
        "raw": InboxMessage.objects.get(event_id=RAW_EVENT_ID),
        "audit": audit,
    }


def _hostile_pages(rows: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """Every console page that shows the hostile rows, with the text each must show as text
    (JSON shows a quote as \\", so payloads are looked for by their pieces without quotes)."""
    event, message, raw = rows["event"], rows["message"], rows["raw"]
    held_key = {"consumer_group": GROUP, "topic": TOPIC, "key": INBOX_KEY}
    return {
        "dashboard": ("/admin/", [ATTRIBUTE + SCRIPT, OUTBOX_KEY, SCRIPT_END]),
        "outbox list, searched by key": (
            f"/admin/outbox/outboxevent/?{urlencode({'q': OUTBOX_KEY})}",
            [SCRIPT, f"{ATTRIBUTE} {OUTBOX_KEY}"],
        ),
        "outbox list, filtered by type": (
            f"/admin/outbox/outboxevent/?{urlencode({'event_type': SCRIPT})}",
            [SCRIPT, f"{ATTRIBUTE} {OUTBOX_KEY}"],
        ),
        "outbox list, failed": ("/admin/outbox/outboxevent/?status__exact=FAILED", [SCRIPT]),
        "outbox detail": (
            f"/admin/outbox/outboxevent/{event.pk}/change/",
            [SCRIPT, ATTRIBUTE, OUTBOX_KEY, ERROR, LINK, TEMPLATE],
        ),
        "release key": (
            "/admin/outbox/outboxevent/release-key/?"
            + urlencode({"topic": TOPIC, "key": OUTBOX_KEY}),
            [OUTBOX_KEY],
        ),
        "inbox list, searched by key": (
            f"/admin/inbox/inboxmessage/?{urlencode({'q': INBOX_KEY})}",
            [SCRIPT, message.event_id],
        ),
        "inbox list, searched by event id": (
            f"/admin/inbox/inboxmessage/?{urlencode({'q': RAW_EVENT_ID})}",
            [RAW_EVENT_ID, TEMPLATE],
        ),
        "inbox detail": (
            f"/admin/inbox/inboxmessage/{message.pk}/change/",
            [SCRIPT, ATTRIBUTE, INBOX_KEY, LINK, TEMPLATE, "cannot apply"],
        ),
        "inbox detail, record not JSON": (
            f"/admin/inbox/inboxmessage/{raw.pk}/change/",
            [RAW_EVENT_ID, TEMPLATE, RAW_VALUE.decode()],
        ),
        "held keys": ("/admin/inbox/inboxmessage/held-keys/", [INBOX_KEY, ATTRIBUTE]),
        "held key action": (
            "/admin/inbox/inboxmessage/held-keys/act/?"
            + urlencode({"action": OperatorAction.Action.INBOX_SEQUENCE_RETRY, **held_key}),
            [INBOX_KEY],
        ),
        "audit log": ("/admin/console/operatoraction/", [f"{SCRIPT} {ATTRIBUTE}"]),
        "audit entry": (
            f"/admin/console/operatoraction/{rows['audit'].pk}/change/",
            [NOTE, SCRIPT_END, TEMPLATE],
        ),
        "findings": (
            "/admin/analytics/reconciliationfinding/",
            [SCRIPT, ATTRIBUTE, f"{SCRIPT_END} {LINK}"],
        ),
        "API, outbox event": (f"/api/outbox/events/{event.pk}/", [SCRIPT, LINK, TEMPLATE]),
        "API, inbox message": (f"/api/inbox/messages/{message.pk}/", [SCRIPT, LINK, TEMPLATE]),
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("policy", ["in force", "off"])
def test_hostile_text_is_shown_as_text(live_server, browser, superuser, settings, policy):
    """With the policy off, escaping alone must keep the text inert: the policy is a second
    wall, not the first."""
    from selenium.webdriver.common.by import By

    if policy == "off":
        settings.CONTENT_SECURITY_POLICY = None
    settings.CONSOLE_DASHBOARD_CACHE_SECONDS = 0
    rows = _hostile_rows(superuser, settings)
    # Anyone who reaches the login page chooses the user name and the browser's name that the
    # console's pages of failed logins show.
    browser.execute_cdp_cmd("Network.setUserAgentOverride", {"userAgent": USER_AGENT})
    log_in(browser, live_server.url, LOGIN_NAME, "wrong")
    _check_page(browser, "login page, refused", [])
    assert browser.find_element(By.NAME, "username").get_attribute("value") == LOGIN_NAME
    browser.execute_cdp_cmd("Network.setUserAgentOverride", {"userAgent": "console-e2e"})
    log_in(browser, live_server.url, "admin", PASSWORD)
    browser.get_log("browser")

    pages = _hostile_pages(rows)
    # Every other page of the admin too, those of failed logins among them.
    for name, url in _admin_pages(superuser).items():
        pages.setdefault(name, (url, []))
    texts = []
    for name, (url, expected) in pages.items():
        browser.get(live_server.url + url)
        texts.append(_check_page(browser, name, expected))
    assert any(LOGIN_NAME in text for text in texts)
    assert any(USER_AGENT in text for text in texts)


def _check_page(browser: Any, name: str, expected: list[str]) -> str:
    """The page shown ran nothing of the hostile text, made no element or link of it, and
    shows `expected` as text; returns its text."""
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 (reading it is the check)
    report = page_report(browser)
    found = browser.execute_script(INJECTED_SCRIPT)
    assert found["xss"] is None, name
    assert found["elements"] == [], name
    assert found["scripts"] == [], name
    assert found["links"] == [], name
    missing = [text for text in expected if text not in found["text"]]
    assert missing == [], (name, missing)
    assert_no_violations(report, name)
    return str(found["text"])
