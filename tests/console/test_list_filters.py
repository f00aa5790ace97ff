"""The list filters that find their rows through another table or an index of their own (the
publish window, the error class, the discarded events) pick exactly the rows the filter names,
whichever way they read them: by the few ids the other table gives, or the list newest first
when those are many. And every filter of the outbox and inbox lists has a row in the console
benchmark, which measures it on a million rows."""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.db import transaction
from django.utils import timezone

import outbox
from benchmarks.console_filters import FILTER_LISTS
from console.api.inbox.filters import InboxMessageFilter
from console.api.outbox.filters import OutboxEventFilter
from console.selectors import NO_ERROR_TEXT, rows_of_error_class
from inbox.models import InboxMessage
from outbox.models import OutboxDelivery, OutboxEvent
from outbox.selectors import outbox_events_published, outbox_events_with_delivery
from tests.console.conftest import client_for, hold
from tests.console.test_log_relay_console import TIMED_OUT, TOO_BIG, record

API = "/api/outbox/events/"


def _admin_filter_names(model: type) -> set[str]:
    """The names the benchmark's rows give the admin list's filters: a field filter by its
    field, a filter class by its parameter, the search box as q."""
    model_admin = admin.site._registry[model]
    names: set[str] = set()
    entry: Any
    for entry in model_admin.list_filter:
        if isinstance(entry, str):
            names.add(entry)
        elif isinstance(entry, tuple):
            names.add(str(entry[0]))
        else:
            names.add(entry.parameter_name)
    if model_admin.search_fields:
        names.add("q")
    return names


def test_every_list_filter_has_a_benchmark_row():
    lists = {rows.name: set(rows.filters) for rows in FILTER_LISTS}
    assert lists["api outbox"] == set(OutboxEventFilter.base_filters)
    assert lists["api inbox"] == set(InboxMessageFilter.base_filters)
    assert lists["admin outbox"] == _admin_filter_names(OutboxEvent)
    assert lists["admin inbox"] == _admin_filter_names(InboxMessage)
    for rows in FILTER_LISTS:
        for name, values in rows.filters.items():
            # Each filter is measured with values (the status alone, by its statuses).
            assert values or name.startswith("status"), (rows.name, name)


@pytest.fixture(params=["by id", "newest first"])
def read_way(request, monkeypatch):
    """Each filter read both ways: by the few ids another table gives (the default with a
    handful of rows), or, when those ids are as many as FEW_EVENTS, the list newest first."""
    if request.param == "newest first":
        monkeypatch.setattr("outbox.selectors.FEW_EVENTS", 1)
        monkeypatch.setattr("console.selectors.FEW_EVENTS", 1)
    return request.param


@pytest.mark.django_db
def test_a_publish_window_holds_the_events_whose_latest_publication_is_in_it(read_way, make_event):
    now = timezone.now()
    three_days_ago, two_days_ago, one_day_ago = (now - timedelta(days=d) for d in (3, 2, 1))
    old = make_event(OutboxEvent.Status.DONE, published_at=two_days_ago)
    recent = make_event(OutboxEvent.Status.DONE)
    # Published two days ago, then replayed and published again now: its latest publication
    # is now, though a record of the earlier window is its.
    replayed = make_event(OutboxEvent.Status.DONE, published_at=two_days_ago)
    record(replayed, "PUBLISHED", at=now, partition=0, offset=9)
    make_event(OutboxEvent.Status.FAILED)
    make_event(OutboxEvent.Status.PENDING)
    events = outbox_events_with_delivery(OutboxEvent.objects.all())

    def ids(**bounds):
        return {event.pk for event in outbox_events_published(events, **bounds)}

    assert ids(gte=three_days_ago, lt=one_day_ago) == {old.pk}
    assert ids(gte=one_day_ago) == {recent.pk, replayed.pk}
    assert ids(lt=one_day_ago) == {old.pk}
    assert ids(lte=now + timedelta(minutes=1)) == {old.pk, recent.pk, replayed.pk}
    assert ids(gte=now + timedelta(days=1)) == set()
    assert ids(lt=three_days_ago) == set()


@pytest.mark.django_db
def test_the_api_reads_a_publish_window_with_both_ends(viewer, make_event):
    now = timezone.now()
    old = make_event(OutboxEvent.Status.DONE, published_at=now - timedelta(days=2))
    make_event(OutboxEvent.Status.DONE)
    make_event(OutboxEvent.Status.DONE, published_at=now - timedelta(days=4))
    window = {
        "published_after": (now - timedelta(days=3)).isoformat(),
        "published_before": (now - timedelta(days=1)).isoformat(),
    }
    body = client_for(viewer).get(API, window).json()
    assert [row["id"] for row in body["results"]] == [str(old.pk)]


@pytest.mark.django_db
def test_the_outbox_error_class_is_the_error_users_see(read_way, make_event):
    start = timezone.now() - timedelta(minutes=10)
    # Published at its second try: its error is the failed try's.
    retried = make_event(key="k-retried")
    record(retried, "FAILED", at=start, error=TIMED_OUT)
    record(retried, "PUBLISHED", at=start + timedelta(seconds=1), partition=0, offset=1)
    # Failed twice, held: the latest error is too big, not timed out.
    held = make_event(key="k-held")
    record(held, "FAILED", at=start, error=TIMED_OUT)
    record(held, "FAILED", at=start + timedelta(seconds=1), error=TOO_BIG)
    hold(held, attempts=2, error=TOO_BIG)
    # Held with an error and no failed try recorded (an earlier version's count only).
    counted = make_event(key="k-counted")
    hold(counted, attempts=1, error="NOT_ENOUGH_REPLICAS: Broker: Not enough replicas")
    clean = make_event(OutboxEvent.Status.DONE, key="k-clean")
    # A caller's own id (random): found at the time its given-id row keeps.
    with transaction.atomic():
        given = outbox.publish(
            aggregate_type="order",
            aggregate_id="k-given",
            event_type="OrderPlaced",
            payload={},
            topic="console.orders",
            event_id=uuid.uuid4(),
        )
    record(given, "FAILED", at=start, error="REQUEST_TIMED_OUT: Broker: Request timed out")
    events = outbox_events_with_delivery(OutboxEvent.objects.all())

    def ids(error_class):
        rows = rows_of_error_class(events, error_class, field="delivery_error")
        return {event.pk for event in rows}

    assert ids("MSG_TIMED_OUT") == {retried.pk}
    assert ids("MSG_SIZE_TOO_LARGE") == {held.pk}
    assert ids("NOT_ENOUGH_REPLICAS") == {counted.pk}
    assert ids("REQUEST_TIMED_OUT") == {given.pk}
    assert ids("MSG") == set()
    assert clean.pk in ids(NO_ERROR_TEXT)
    assert {retried.pk, held.pk, counted.pk}.isdisjoint(ids(NO_ERROR_TEXT))


@pytest.mark.django_db
def test_the_inbox_error_class_is_the_text_before_the_colon_of_the_first_line(make_message):
    rows = {
        text: make_message(InboxMessage.Status.FAILED, last_error=text).pk
        for text in (
            "ValueError: boom",
            "ValueError\nTraceback (most recent call last):",
            "ValueError",
            "ValueErrorX: another class",
            "KeyError: 'ValueError: quoted'",
        )
    }
    done = make_message(InboxMessage.Status.DONE, last_error="").pk

    def ids(error_class):
        matching = rows_of_error_class(InboxMessage.objects.all(), error_class, field="last_error")
        return set(matching.values_list("pk", flat=True))

    assert ids("ValueError") == {
        rows["ValueError: boom"],
        rows["ValueError\nTraceback (most recent call last):"],
        rows["ValueError"],
    }
    assert ids("KeyError") == {rows["KeyError: 'ValueError: quoted'"]}
    assert ids(NO_ERROR_TEXT) == {done}


@pytest.mark.django_db
def test_a_discarded_event_is_found_whatever_its_id(viewer, make_event):
    # One id drawn by publish() (it carries its creation time), one of the caller's own (a
    # random one: its time is the given-id row's).
    drawn = make_event(OutboxEvent.Status.FAILED, discarded_at=timezone.now())
    with transaction.atomic():
        given = outbox.publish(
            aggregate_type="order",
            aggregate_id="order-given",
            event_type="OrderPlaced",
            payload={"order": "order-given"},
            topic="console.orders",
            event_id=uuid.uuid4(),
        )
    record(given, "FAILED", error=TOO_BIG)
    record(given, "DISCARDED", relay="operator")
    make_event(OutboxEvent.Status.FAILED)
    client = client_for(viewer)

    def ids(**query):
        return {row["id"] for row in client.get(API, query).json()["results"]}

    assert ids(discarded="true") == {str(drawn.pk), str(given.pk)}
    assert ids(discarded="true", status="FAILED") == {str(drawn.pk), str(given.pk)}
    assert ids(discarded="true", status="DONE") == set()


@pytest.mark.django_db
def test_a_discard_records_where_its_event_row_is(operator, make_event):
    # The discarded filter reads the event rows by these places, not by a look-up of each id.
    event = make_event(OutboxEvent.Status.FAILED)
    client = client_for(operator)
    assert client.post(f"{API}{event.pk}/discard/", {}, format="json").status_code == 200
    discard = OutboxDelivery.objects.get(event_id=event.pk, outcome="DISCARDED")
    assert (discard.event_created_at, discard.event_transaction_id, discard.event_position) == (
        event.created_at,
        event.transaction_id,
        event.position,
    )
    listed = client.get(API, {"discarded": "true"}).json()["results"]
    assert [row["id"] for row in listed] == [str(event.pk)]
