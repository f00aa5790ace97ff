"""End to end in headless Chromium (Debian's chromium and chromium-driver; `make test`
installs them): a real relay fails to send events until their attempts are spent; log in,
open the dashboard, filter the FAILED outbox events, retry them, run the relay and see them
published. Saves a screenshot of the dashboard in artifacts/."""

from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from console.models import OperatorAction
from outbox.models import OutboxEvent, OutboxHeldEvent
from outbox.producer import close_producers
from outbox.selectors import outbox_events_with_delivery
from tests.conftest import publish_numbered
from tests.e2e.conftest import log_in, needs_browser

ARTIFACTS = Path(settings.BASE_DIR) / "artifacts"

pytestmark = [pytest.mark.kafka, needs_browser]


def _failed_events(relay, topic: str, count: int) -> list[OutboxEvent]:
    """`count` events, each of its own key, too large for the producer of `relay` (a
    size_limited_log_relay): sent until their attempts are spent, they are FAILED."""
    events = [
        publish_numbered(topic, f"payment-{number}", 0, too_large=True) for number in range(count)
    ]
    assert relay.run().failed == count
    OutboxHeldEvent.objects.filter(attempts__gt=0).update(next_attempt_at=timezone.now())
    assert relay.run().failed == count  # the second and last attempt
    return events


@pytest.mark.django_db(transaction=True)
def test_an_operator_retries_failed_events_from_the_browser(
    live_server, browser, kafka_topic, size_limited_log_relay, settings
):
    from django.core.cache import cache
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import Select, WebDriverWait

    cache.clear()  # no dashboard card cached by an earlier test
    User.objects.create_superuser("admin", "admin@example.com", "e2e-password")
    topic = kafka_topic()
    events = _failed_events(size_limited_log_relay, topic, 3)
    ids = {str(event.pk) for event in events}

    log_in(browser, live_server.url, "admin", "e2e-password")

    browser.get(f"{live_server.url}/admin/")
    dashboard = browser.find_element(By.ID, "console-dashboard")
    assert "Outbox FAILED" in dashboard.text
    assert "MSG_SIZE_TOO_LARGE" in dashboard.text
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "console-dashboard.png"))

    browser.get(f"{live_server.url}/admin/outbox/outboxevent/?status__exact=FAILED")
    listed = browser.find_element(By.ID, "result_list").text
    assert all(event_id in listed for event_id in ids)
    browser.find_element(By.ID, "action-toggle").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("retry_selected")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    # A bulk action asks for its reason first.
    reason = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.NAME, "reason"))
    )
    reason.send_keys("The size limit was raised")
    browser.find_element(By.ID, "confirm-selected").click()
    # Read the page the action's POST leads to, not the list still shown while it loads (its
    # body goes stale under a loaded machine): wait until the message is there.
    WebDriverWait(browser, 10).until(
        expected_conditions.text_to_be_present_in_element(
            (By.TAG_NAME, "body"), "Retry: 3 of 3 selected"
        )
    )

    # Without the size limit, the producer takes them now.
    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {}}
    close_producers()
    assert size_limited_log_relay.run(max_seconds=30).published == 3

    browser.get(f"{live_server.url}/admin/outbox/outboxevent/?status__exact=DONE")
    listed = browser.find_element(By.ID, "result_list").text
    assert all(event_id in listed for event_id in ids)
    events = outbox_events_with_delivery(OutboxEvent.objects.filter(pk__in=ids))
    assert events.filter(delivery_status=OutboxEvent.Status.DONE).count() == 3
    entry = OperatorAction.objects.get()
    assert (entry.username, entry.action, entry.changed) == ("admin", "outbox.retry", 3)
    assert entry.reason == "The size limit was raised"
