"""The failure groups and bulk operations in headless Chromium, as an operator walks them: the
outbox's and the inbox's failure-groups pages list the groups of the rows that failed for
good; "Retry this group" confirms the group's own count (not the events an operator
discarded) and refuses to run without a reason, then runs as a bulk operation whose progress
page shows it done; "Discard this group" queued for a worker is cancelled from its progress
page before any row changes. Each step is checked on the page and in the database (the rows,
the operation, the audit entries)."""

from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from console.bulk_operations import bulk_operation_run
from console.models import BulkOperation, BulkOperationChunk, OperatorAction
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from outbox.selectors import outbox_event_delivered
from tests.console.conftest import TIMED_OUT, TOO_LARGE
from tests.e2e.conftest import (
    assert_no_violations,
    log_in,
    needs_browser,
    page_report,
    wait_until_replaced,
)

pytestmark = needs_browser

EVENTS = "/admin/outbox/outboxevent/"
MESSAGES = "/admin/inbox/inboxmessage/"
# The password the console's make_user gives its users.
PASSWORD = "pw"
REASON = "broker size limit raised, INC-42"
DISCARD_REASON = "stale orders, INC-43"
CANCEL_NOTE = "wrong group: the prices were fixed upstream"


def _error_class(error: str) -> str:
    return error.split(":")[0]


def _groups_shown(browser: Any, page: str) -> dict[tuple[str, ...], Any]:
    """The rows of the failure-groups table the browser shows, by (error class, topic[, group]):
    each row's count as shown and its element (for its links)."""
    from selenium.webdriver.common.by import By

    table = browser.find_element(By.ID, "failure-groups")
    headers = [cell.text for cell in table.find_elements(By.CSS_SELECTOR, "thead th")]
    groups: dict[tuple[str, ...], Any] = {}
    for row in table.find_elements(By.CSS_SELECTOR, "tbody tr"):
        texts = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
        cells = dict(zip(headers, texts, strict=True))
        # The inbox's groups are per consumer group too.
        names = ("Error class", "Topic", "Group") if "Group" in cells else ("Error class", "Topic")
        key = tuple(cells[name] for name in names)
        groups[key] = (int(cells["Rows"]), row)
    assert_no_violations(page_report(browser), page)
    return groups


def _counts(groups: dict[tuple[str, ...], Any]) -> dict[tuple[str, ...], int]:
    return {key: count for key, (count, _) in groups.items()}


def _submit(browser: Any, button_id: str) -> None:
    """Presses the button and waits until the page its form leads to has replaced this one."""
    from selenium.webdriver.common.by import By

    button = browser.find_element(By.ID, button_id)
    button.click()
    wait_until_replaced(browser, button, 20)


def _text(browser: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.ID, element_id).text)


def _shown(browser: Any, selector: str) -> bool:
    """Whether the page has an element that `selector` matches, asked without the driver's
    implicit wait (which would wait its seconds for every element that is rightly absent)."""
    from selenium.webdriver.common.by import By

    waits = browser.timeouts.implicit_wait
    browser.implicitly_wait(0)
    try:
        return bool(browser.find_elements(By.CSS_SELECTOR, selector))
    finally:
        browser.implicitly_wait(waits)


def _status(event: OutboxEvent) -> str:
    return str(outbox_event_delivered(event_id=event.pk).delivery_status)


@pytest.mark.django_db(transaction=True)
def test_an_operator_retries_and_cancels_failure_groups_from_the_browser(
    live_server, browser, operator, failed_events, make_event, make_message, settings, monkeypatch
):
    from selenium.webdriver.common.by import By

    cache.clear()  # no throttle or page cached by an earlier test
    settings.CONSOLE_BULK_CHUNK_SIZE = 2  # a group of 3 rows: a bulk operation of 2 chunks
    # Of a group's error class and topic, but discarded by an operator: in no group.
    discarded = make_event(
        OutboxEvent.Status.FAILED, topic="orders.a", error=TOO_LARGE, discarded_at=timezone.now()
    )
    no_price = [
        make_message(
            InboxMessage.Status.FAILED, group="billing", last_error="ValueError: no price\n  ..."
        )
        for _ in range(3)
    ]
    no_sku = make_message(InboxMessage.Status.FAILED, group="shipping", last_error="KeyError: sku")
    log_in(browser, live_server.url, operator.username, PASSWORD)

    # The outbox's groups: the FAILED events no operator discarded, by error class and topic.
    browser.get(f"{live_server.url}{EVENTS}failure-groups/")
    groups = _groups_shown(browser, "outbox failure groups")
    too_large_a = (_error_class(TOO_LARGE), "orders.a")
    others = {(_error_class(TOO_LARGE), "orders.b"): 2, (_error_class(TIMED_OUT), "orders.a"): 1}
    assert _counts(groups) == {too_large_a: 3, **others}

    # "Retry this group": the confirmation counts the group's own rows.
    groups[too_large_a][1].find_element(By.LINK_TEXT, "Retry this group").click()
    assert _text(browser, "bulk-count") == "3"
    assert "status__exact = waiting" in browser.find_element(By.TAG_NAME, "body").text
    assert_no_violations(page_report(browser), "retry confirmation")

    # No reason: the browser does not send the form (its reason is required)...
    reason = browser.find_element(By.NAME, "reason")
    browser.execute_script("document.body.dataset.unsent = 'yes'")
    browser.find_element(By.ID, "confirm-bulk").click()
    page_report(browser)  # the page settles: a form sent would have replaced it by now
    assert browser.execute_script("return document.body.dataset.unsent") == "yes"
    assert browser.execute_script("return arguments[0].validity.valueMissing", reason)
    # ...and a reason of blanks, which the browser lets through, the console refuses.
    reason.send_keys("   ")
    _submit(browser, "confirm-bulk")
    assert "A bulk action needs a reason" in _text(browser, "reason-error")
    assert _text(browser, "bulk-count") == "3"
    assert not OperatorAction.objects.exists()
    assert not BulkOperation.objects.exists()
    assert {_status(event) for event in failed_events["large_a"]} == {"FAILED"}

    # With a reason: the group's retry runs as a bulk operation, and its progress page shows
    # it done (a test's task runs in the request, as soon as the submit commits).
    reason = browser.find_element(By.NAME, "reason")
    reason.clear()
    reason.send_keys(REASON)
    _submit(browser, "confirm-bulk")
    entry = OperatorAction.objects.get()
    operation = BulkOperation.objects.get()
    body = browser.find_element(By.TAG_NAME, "body").text
    assert f"Retry: 3 rows frozen and queued in 2 chunks (audit #{entry.pk})" in body
    assert browser.current_url.endswith(f"/admin/console/bulkoperation/{operation.pk}/change/")
    shown = {name: _text(browser, f"bulk-{name}") for name in ("status", "chunks", "rows")}
    assert shown == {"status": "DONE", "chunks": "2 of 2", "rows": "3 of 3"}
    assert _text(browser, "bulk-changed") == "3"
    assert REASON in _text(browser, "bulk-progress")
    assert not _shown(browser, "meta[http-equiv=refresh]")
    assert_no_violations(page_report(browser), "progress of the retry")
    assert (entry.username, entry.action, entry.requested, entry.changed) == (
        operator.username,
        OperatorAction.Action.OUTBOX_RETRY,
        3,
        3,
    )
    assert entry.reason == REASON
    assert entry.filters == {
        "status__exact": ["waiting"],
        "error_class": [too_large_a[0]],
        "topic": ["orders.a"],
    }
    assert (operation.status, operation.chunks_done, operation.rows_changed) == ("DONE", 2, 3)
    assert {_status(event) for event in failed_events["large_a"]} == {"PENDING"}
    others_failed = [*failed_events["large_b"], *failed_events["timeout_a"], discarded]
    assert {_status(event) for event in others_failed} == {"FAILED"}
    browser.get(f"{live_server.url}{EVENTS}failure-groups/")
    assert _counts(_groups_shown(browser, "outbox failure groups, after")) == others

    # The inbox's groups, also by consumer group. Its discard is queued for a worker that never
    # comes: the operation waits, QUEUED, for its cancel.
    queued: list[int] = []
    monkeypatch.setattr("console.bulk_operations._enqueue_run", queued.append)
    # The page must not reload between finding its Cancel button and pressing it.
    monkeypatch.setattr("console.admin.bulk.PROGRESS_REFRESH_SECONDS", 600)
    browser.get(f"{live_server.url}{MESSAGES}failure-groups/")
    groups = _groups_shown(browser, "inbox failure groups")
    no_price_group = ("ValueError", "console.orders", "billing")
    assert _counts(groups) == {no_price_group: 3, ("KeyError", "console.orders", "shipping"): 1}
    groups[no_price_group][1].find_element(By.LINK_TEXT, "Discard this group").click()
    assert _text(browser, "bulk-count") == "3"
    browser.find_element(By.NAME, "reason").send_keys(DISCARD_REASON)
    _submit(browser, "confirm-bulk")
    discard = OperatorAction.objects.get(action=OperatorAction.Action.INBOX_DISCARD)
    operation = BulkOperation.objects.get(audit=discard)
    assert queued == [operation.pk]
    shown = {name: _text(browser, f"bulk-{name}") for name in ("status", "chunks", "rows")}
    assert shown == {"status": "QUEUED", "chunks": "0 of 2", "rows": "0 of 3"}
    # A page of an operation that has not ended reloads itself.
    assert _shown(browser, "meta[http-equiv=refresh]")
    assert_no_violations(page_report(browser), "progress of the queued discard")

    browser.find_element(By.NAME, "note").send_keys(CANCEL_NOTE)
    _submit(browser, "cancel-bulk")
    assert (
        f"Bulk operation {operation.pk}: cancelled."
        in browser.find_element(By.TAG_NAME, "body").text
    )
    assert _text(browser, "bulk-status") == "CANCELLED"
    assert "Cancelled by\n" + operator.username in _text(browser, "bulk-progress")
    assert not _shown(browser, "#cancel-bulk")
    assert not _shown(browser, "meta[http-equiv=refresh]")
    assert_no_violations(page_report(browser), "progress of the cancelled discard")
    operation.refresh_from_db()
    assert (operation.status, operation.cancelled_by, operation.rows_changed) == (
        "CANCELLED",
        operator.username,
        0,
    )
    assert not BulkOperationChunk.objects.filter(operation=operation).exists()
    assert discard.reason == DISCARD_REASON
    cancel = OperatorAction.objects.get(action=OperatorAction.Action.BULK_CANCEL)
    assert (cancel.username, cancel.note) == (operator.username, CANCEL_NOTE)
    assert cancel.filters == {"operation": operation.pk, "audit": discard.pk}
    # The worker that comes late finds the operation cancelled: no message is discarded.
    assert bulk_operation_run(operation_id=operation.pk).status == "CANCELLED"
    messages = InboxMessage.objects.filter(pk__in=[m.pk for m in [*no_price, no_sku]])
    assert not messages.filter(discarded_at__isnull=False).exists()
    browser.get(f"{live_server.url}{MESSAGES}failure-groups/")
    assert _counts(_groups_shown(browser, "inbox failure groups, after"))[no_price_group] == 3
