"""Payloads and headers only for users with console.view_payload, and the fields
CONSOLE_MASKED_FIELDS names masked for them, in the admin and the API alike."""

import pytest

from console.checks import check_masked_fields
from console.privacy import MASK, MaskedFieldError, masked, masked_field_paths
from tests.console.conftest import client_for, detail_pages

pytestmark = pytest.mark.django_db

EVENTS_API = "/api/outbox/events/"
MESSAGES_API = "/api/inbox/messages/"
SECRET_VALUES = ("12.50", "acme")  # the fixtures' payload amount and header tenant


def _api_bodies(user, event, message) -> list[dict]:
    client = client_for(user)
    return [
        client.get(f"{EVENTS_API}{event.pk}/").json(),
        client.get(f"{MESSAGES_API}{message.pk}/").json(),
    ]


@pytest.fixture
def event_and_message(make_event, make_message):
    event = make_event()
    message = make_message(
        event_id=str(event.pk),
        payload={"order": "order-1", "amount": "12.50"},
        headers={"tenant": "acme"},
        raw_value="not json: 12.50",
    )
    return event, message


def test_without_the_permission_payloads_and_headers_are_hidden(viewer, event_and_message):
    for html in detail_pages(viewer, *event_and_message):
        assert "Hidden: seeing them needs the permission console.view_payload." in html
        assert not any(value in html for value in SECRET_VALUES)
    event_body, message_body = _api_bodies(viewer, *event_and_message)
    assert (event_body["payload"], event_body["headers"]) == (None, None)
    assert (message_body["payload"], message_body["headers"], message_body["raw_value"]) == (
        None,
        None,
        None,
    )
    # The rest of the detail is there.
    assert event_body["id"] == str(event_and_message[0].pk)


def test_with_the_permission_they_are_shown_with_the_masked_fields_masked(
    payload_viewer, event_and_message, settings
):
    settings.CONSOLE_MASKED_FIELDS = ["payload.amount", "headers.tenant"]
    for html in detail_pages(payload_viewer, *event_and_message):
        assert "Hidden:" not in html
        assert f"&quot;amount&quot;: &quot;{MASK}&quot;" in html
        assert f"&quot;tenant&quot;: &quot;{MASK}&quot;" in html
        assert "&quot;acme&quot;" not in html
    event_body, message_body = _api_bodies(payload_viewer, *event_and_message)
    for body in (event_body, message_body):
        assert body["payload"]["amount"] == MASK
        assert body["headers"]["tenant"] == MASK
    assert message_body["payload"]["order"] == "order-1"
    # Kept as received: a record that was not JSON has no fields to mask.
    assert message_body["raw_value"] == "not json: 12.50"


def test_with_the_permission_and_nothing_masked_everything_is_shown(
    payload_viewer, event_and_message, settings
):
    settings.CONSOLE_MASKED_FIELDS = []
    event_body, message_body = _api_bodies(payload_viewer, *event_and_message)
    assert event_body["payload"]["amount"] == "12.50"
    assert message_body["headers"] == {"tenant": "acme"}


def test_masking_follows_keys_list_items_and_stars_and_leaves_the_original(settings):
    settings.CONSOLE_MASKED_FIELDS = [
        "payload.customer.email",
        "payload.items.*.card",
        "payload.notes.1",
        "payload.absent.key",
    ]
    payload = {
        "customer": {"email": "a@example.com", "name": "A"},
        "items": [{"card": "4111", "sku": "x"}, {"sku": "y"}, "plain"],
        "notes": ["first", "second"],
    }
    assert masked(payload, "payload") == {
        "customer": {"email": MASK, "name": "A"},
        "items": [{"card": MASK, "sku": "x"}, {"sku": "y"}, "plain"],
        "notes": ["first", MASK],
    }
    assert payload["customer"]["email"] == "a@example.com"
    assert masked(payload, "headers") is payload  # nothing masked in headers


@pytest.mark.parametrize(
    "entry", ["customer.email", "payload", "payload..email", "body.email", "headers."]
)
def test_an_entry_that_names_no_field_is_refused_and_fails_the_checks(entry, settings):
    with pytest.raises(MaskedFieldError, match=r"a masked field is 'payload\.' or 'headers\.'"):
        masked_field_paths([entry])
    settings.CONSOLE_MASKED_FIELDS = [entry]
    [error] = check_masked_fields(None)
    assert error.id == "console.E002"
    assert repr(entry) in error.msg
