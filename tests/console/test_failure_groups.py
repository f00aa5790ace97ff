"""Failure groups: FAILED rows grouped by error class and topic (and consumer group), each
with its count, first and last seen and a sample; retrying or discarding a group confirms its
count first, acts on that group alone, and is audited."""

import pytest
from django.utils import timezone

from console.models import OperatorAction
from console.selectors import NO_ERROR_TEXT, failure_groups
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from outbox.selectors import outbox_event_delivered
from tests.console.conftest import (
    ACTION_PERMISSIONS,
    TOO_LARGE,
    VIEW_PERMISSIONS,
    logged_in,
)

pytestmark = pytest.mark.django_db

EVENTS = "/admin/outbox/outboxevent/"
MESSAGES = "/admin/inbox/inboxmessage/"


def test_outbox_failures_are_grouped_by_error_class_and_topic(failed_events):
    groups = {(g.error_class, g.topic): g for g in failure_groups("outbox")}
    assert {key: g.count for key, g in groups.items()} == {
        ("MSG_SIZE_TOO_LARGE", "orders.a"): 3,
        ("MSG_SIZE_TOO_LARGE", "orders.b"): 2,
        ("MSG_TIMED_OUT", "orders.a"): 1,
    }
    largest = groups[("MSG_SIZE_TOO_LARGE", "orders.a")]
    assert largest.first_seen <= largest.last_seen
    assert largest.sample_id in {event.pk for event in failed_events["large_a"]}
    assert largest.sample_error == TOO_LARGE
    # Largest first.
    assert [g.count for g in failure_groups("outbox")] == [3, 2, 1]


def test_retrying_a_group_confirms_its_count_and_retries_it_alone(
    operator, failed_events, make_event
):
    # Of the group's class and topic but discarded by an operator: in no group.
    discarded = make_event(
        OutboxEvent.Status.FAILED, topic="orders.a", error=TOO_LARGE, discarded_at=timezone.now()
    )
    client = logged_in(operator)
    page = client.get(f"{EVENTS}failure-groups/").content.decode()
    assert "MSG_SIZE_TOO_LARGE" in page
    assert "Retry this group" in page
    assert "Discard this group" in page
    query = "status__exact=waiting&error_class=MSG_SIZE_TOO_LARGE&topic=orders.a"
    assert f"{EVENTS}retry-matching/?{query}" in page.replace("&amp;", "&")

    confirmation = client.get(f"{EVENTS}retry-matching/?{query}").content.decode()
    assert ">3<" in confirmation.replace(" ", "")
    response = client.post(
        f"{EVENTS}retry-matching/", {"_changelist_filters": query, "reason": "broker limit raised"}
    )
    assert response.status_code == 302
    entry = OperatorAction.objects.get()
    assert (entry.action, entry.requested, entry.changed) == ("outbox.retry", 3, 3)
    assert entry.reason == "broker limit raised"
    assert entry.filters["error_class"] == ["MSG_SIZE_TOO_LARGE"]

    def status(event: OutboxEvent) -> str:
        return str(outbox_event_delivered(event_id=event.pk).delivery_status)

    assert {status(event) for event in failed_events["large_a"]} == {"PENDING"}
    assert status(discarded) == "FAILED"
    assert {status(event) for event in failed_events["large_b"]} == {"FAILED"}
    assert {status(event) for event in failed_events["timeout_a"]} == {"FAILED"}


def test_a_group_past_the_count_limit_confirms_its_own_count(operator, failed_events, settings):
    settings.CONSOLE_COUNT_LIMIT = 2
    client = logged_in(operator)
    group = "status__exact=waiting&error_class=MSG_SIZE_TOO_LARGE&topic=orders.a"
    for action in ("retry", "discard"):
        confirmation = client.get(f"{EVENTS}{action}-matching/?{group}")
        assert (confirmation.context["count"], confirmation.context["count_is_exact"]) == (3, True)
        page = " ".join(confirmation.content.decode().split())
        assert f"{action.capitalize()} 3 rows" in page
        assert "more than" not in page
    # The same filter narrowed further, or any other filter, is counted up to the limit.
    for other in (f"{group}&event_type=OrderPlaced", "status__exact=waiting"):
        confirmation = client.get(f"{EVENTS}retry-matching/?{other}")
        assert (confirmation.context["count"], confirmation.context["count_is_exact"]) == (2, False)
        assert "more than 2" in confirmation.content.decode()


def test_discarding_an_inbox_group_discards_that_group_alone(make_message, make_user):
    def failed(group: str, error: str, count: int) -> list[InboxMessage]:
        return [
            make_message(InboxMessage.Status.FAILED, group=group, last_error=error)
            for _ in range(count)
        ]

    value_errors = failed("billing", "ValueError: no price\n  File ...", 2)
    other_group = failed("shipping", "ValueError: no price", 1)
    key_error = failed("billing", "KeyError: 'sku'", 1)
    no_text = failed("billing", "", 1)
    groups = {(g.error_class, g.consumer_group): g.count for g in failure_groups("inbox")}
    assert groups == {
        ("ValueError", "billing"): 2,
        ("ValueError", "shipping"): 1,
        ("KeyError", "billing"): 1,
        (NO_ERROR_TEXT, "billing"): 1,
    }
    operator = make_user(*VIEW_PERMISSIONS, *ACTION_PERMISSIONS)
    client = logged_in(operator)
    page = client.get(f"{MESSAGES}failure-groups/").content.decode()
    assert "shipping" in page
    query = (
        "status__exact=FAILED&error_class=ValueError&topic=console.orders&consumer_group=billing"
    )
    response = client.post(
        f"{MESSAGES}discard-matching/", {"_changelist_filters": query, "reason": "stale orders"}
    )
    assert response.status_code == 302
    entry = OperatorAction.objects.get()
    assert (entry.action, entry.requested, entry.changed) == ("inbox.discard", 2, 2)
    discarded = set(
        InboxMessage.objects.filter(discarded_at__isnull=False).values_list("pk", flat=True)
    )
    assert discarded == {message.pk for message in value_errors}
    assert not {m.pk for m in other_group + key_error + no_text} & discarded
    # The group of rows without error text is its own, and can be acted on as one.
    listed = client.get(MESSAGES, {"status__exact": "FAILED", "error_class": NO_ERROR_TEXT})
    assert f"{MESSAGES}{no_text[0].pk}/change/" in listed.content.decode()
    assert f"{MESSAGES}{key_error[0].pk}/change/" not in listed.content.decode()


def test_a_viewer_sees_the_groups_but_may_not_act_on_them(viewer, failed_events):
    client = logged_in(viewer)
    page = client.get(f"{EVENTS}failure-groups/").content.decode()
    assert "MSG_TIMED_OUT" in page
    assert "Retry this group" not in page
    assert "Discard this group" not in page
    query = "status__exact=FAILED&error_class=MSG_TIMED_OUT&topic=orders.a"
    assert (
        client.post(
            f"{EVENTS}discard-matching/", {"_changelist_filters": query, "reason": "tidy"}
        ).status_code
        == 403
    )
    assert not OperatorAction.objects.exists()


def test_the_error_class_filter_narrows_the_outbox_list(viewer, failed_events):
    html = logged_in(viewer).get(EVENTS, {"error_class": "MSG_TIMED_OUT"}).content.decode()
    assert f"{EVENTS}{failed_events['timeout_a'][0].pk}/change/" in html
    assert f"{EVENTS}{failed_events['large_a'][0].pk}/change/" not in html
