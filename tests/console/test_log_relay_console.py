"""The outbox pages of the admin and the REST API on what the relay records: status, attempts,
error, publication and discard come from the delivery records and the held set (the event row
is never changed); every attempt is listed; the repairs act on held events.

Most tests write the records the relay writes (OutboxDelivery, OutboxHeldEvent) directly; the
last ones drive a real LogRelay against Kafka and read the pages of its own records."""

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.models import OperatorAction
from outbox.models import OutboxDelivery, OutboxHeldEvent
from outbox.producer import close_producers
from outbox.selectors import outbox_event_delivered
from outbox.services.event_log.shards import shard_of
from tests.conftest import event_row_place, publish_numbered
from tests.console.conftest import VIEW_PERMISSIONS, attempt_rows, client_for, logged_in
from tests.outbox.conftest import consume_all

ADMIN = "/admin/outbox/outboxevent/"
API = "/api/outbox/events/"


def record(
    event,
    outcome,
    *,
    at=None,
    partition=None,
    offset=None,
    error="",
    relay="relay-1",
    duration_ms=None,
):
    return OutboxDelivery.objects.create(
        event_id=event.pk,
        outcome=outcome,
        published_at=at or timezone.now(),
        kafka_partition=partition,
        kafka_offset=offset,
        error=error,
        relay=relay,
        duration_ms=duration_ms,
    )


def hold(event, *, attempts=0, next_attempt_at=None, error=""):
    return OutboxHeldEvent.objects.create(
        event_id=event.pk,
        shard=shard_of(event.key),
        topic=event.topic,
        key=event.key,
        transaction_id=1,
        position=event.position,
        **event_row_place(event),
        attempts=attempts,
        next_attempt_at=next_attempt_at,
        last_error=error,
    )


def field(html: str, label: str) -> str:
    """What the detail page shows in its read-only field `label`."""
    start = html.index(f">{label}</label>")
    value = html.index('class="readonly', start)
    return html[html.index(">", value) + 1 : html.index("</div>", value)].strip()


ATTEMPT_FIELDS = {
    "id",
    "outcome",
    "at",
    "duration_ms",
    "kafka_partition",
    "kafka_offset",
    "error_class",
    "error",
    "relay",
}
TIMED_OUT = "MSG_TIMED_OUT: Local: Message timed out"
TOO_BIG = "MSG_SIZE_TOO_LARGE: Broker: Message too large"


@pytest.fixture
def log_relay_events(make_event):
    """One event in each state, as the relay leaves them."""
    start = timezone.now() - timedelta(minutes=10)
    done = make_event(key="k-done")
    # Written before the relay kept durations: none.
    record(done, "FAILED", at=start, error=TIMED_OUT)
    record(
        done, "PUBLISHED", at=start + timedelta(seconds=1), partition=2, offset=77, duration_ms=7
    )
    failed = make_event(key="k-failed")
    record(failed, "FAILED", at=start, error=TIMED_OUT, duration_ms=30_000)
    record(failed, "FAILED", at=start + timedelta(seconds=2), error=TOO_BIG, duration_ms=0)
    hold(failed, attempts=2, error=TOO_BIG)
    waiting = make_event(key="k-failed")
    hold(waiting)
    discarded = make_event(key="k-discarded")
    record(discarded, "FAILED", at=start, error=TOO_BIG)
    record(discarded, "DISCARDED", at=start + timedelta(seconds=3), relay="operator")
    pending = make_event(key="k-pending")
    return {
        "done": done,
        "failed": failed,
        "waiting": waiting,
        "discarded": discarded,
        "pending": pending,
    }


# --- REST API: serializer and filters ---------------------------------------------------------


@pytest.mark.django_db
def test_api_shows_the_delivery_of_each_state(payload_viewer, log_relay_events):
    client = client_for(payload_viewer)
    rows = {row["id"]: row for row in client.get(API).json()["results"]}
    done = rows[str(log_relay_events["done"].pk)]
    assert (done["status"], done["kafka_partition"], done["kafka_offset"]) == ("DONE", 2, 77)
    assert done["published_at"] is not None
    assert done["attempts"] == 2
    failed = rows[str(log_relay_events["failed"].pk)]
    assert (failed["status"], failed["attempts"], failed["discarded_at"]) == ("FAILED", 2, None)
    assert failed["last_error"] == TOO_BIG
    assert failed["published_at"] is None
    discarded = rows[str(log_relay_events["discarded"].pk)]
    assert discarded["status"] == "FAILED"
    assert discarded["discarded_at"] is not None
    for name in ("waiting", "pending"):
        row = rows[str(log_relay_events[name].pk)]
        assert (row["status"], row["attempts"], row["published_at"]) == ("PENDING", 0, None)
    # When each is tried next: a held head when its backoff ends; none once delivered,
    # discarded or spent, nor for an event waiting its turn (behind its key's head, or not read
    # by the relay yet).
    assert [
        rows[str(log_relay_events[name].pk)]["next_attempt_at"]
        for name in ("done", "failed", "discarded", "waiting", "pending")
    ] == [None, None, None, None, None]
    backing_off = timezone.now() + timedelta(minutes=5)
    OutboxHeldEvent.objects.filter(event_id=log_relay_events["failed"].pk).update(
        next_attempt_at=backing_off
    )
    retried = client.get(f"{API}{log_relay_events['failed'].pk}/").json()
    assert (retried["status"], retried["next_attempt_at"]) == (
        "PENDING",
        backing_off.isoformat().replace("+00:00", "Z"),
    )

    detail = client.get(f"{API}{log_relay_events['done'].pk}/").json()
    assert (detail["status"], detail["kafka_partition"], detail["kafka_offset"]) == ("DONE", 2, 77)
    assert detail["payload"]["amount"] == "12.50"


@pytest.mark.django_db
def test_api_filters_on_the_delivery(viewer, log_relay_events):
    client = client_for(viewer)

    def ids(**query):
        return {row["id"] for row in client.get(API, query).json()["results"]}

    def of(*names):
        return {str(log_relay_events[name].pk) for name in names}

    assert ids(status="DONE") == of("done")
    assert ids(status="FAILED") == of("failed", "discarded")
    assert ids(status="PENDING") == of("waiting", "pending")
    assert ids(discarded="true") == of("discarded")
    assert ids(discarded="false") == of("done", "failed", "waiting", "pending")
    assert ids(status="FAILED", discarded="false") == of("failed")
    published = OutboxDelivery.objects.get(outcome="PUBLISHED").published_at
    assert ids(published_after=published.isoformat()) == of("done")
    assert ids(published_before=published.isoformat()) == set()
    later = (published + timedelta(seconds=1)).isoformat()
    assert ids(published_before=later) == of("done")


@pytest.mark.django_db
def test_each_status_filter_is_exactly_the_delivery_status_it_names(
    viewer, log_relay_events, make_event
):
    # The status filters narrow their events by conditions of their own before the delivery
    # status computed per row decides (FAILED by its places alone, DONE less the events not
    # sent yet): each must pick the events the status names, no more, no fewer.
    start = timezone.now() - timedelta(minutes=5)
    events = dict(log_relay_events)
    events["replayed"] = replayed = make_event(key="k-replayed")
    record(replayed, "DISCARDED", at=start, relay="operator")
    record(replayed, "PUBLISHED", at=start + timedelta(seconds=1), partition=0, offset=5)
    events["held_again"] = held_again = make_event(key="k-held-again")
    record(held_again, "DISCARDED", at=start, relay="operator")
    hold(held_again)
    events["discarded_twice"] = twice = make_event(key="k-discarded-twice")
    record(twice, "PUBLISHED", at=start, partition=0, offset=6)
    record(twice, "DISCARDED", at=start + timedelta(seconds=1), relay="operator")
    record(twice, "DISCARDED", at=start + timedelta(seconds=2), relay="operator")
    events["backing_off"] = backing_off = make_event(key="k-backing-off")
    hold(backing_off, attempts=3, next_attempt_at=timezone.now() + timedelta(minutes=1))

    status = {
        name: outbox_event_delivered(event_id=event.pk).delivery_status
        for name, event in events.items()
    }
    assert {name for name, state in status.items() if state == "FAILED"} == {
        "failed",
        "discarded",
        "discarded_twice",
    }
    assert {name for name, state in status.items() if state == "DONE"} == {
        "done",
        "replayed",
    }
    for state in ("FAILED", "DONE", "PENDING"):
        expected = {str(events[name].pk) for name, named in status.items() if named == state}
        api_rows = client_for(viewer).get(API, {"status": state}).json()["results"]
        assert {row["id"] for row in api_rows} == expected, state
        admin = logged_in(viewer).get(ADMIN, {"status__exact": state})
        assert admin.status_code == 200
        assert {str(event.pk) for event in admin.context["cl"].result_list} == expected, state
    # The FAILED events no operator discarded: the held heads whose attempts are spent.
    waiting = logged_in(viewer).get(ADMIN, {"status__exact": "waiting"})
    assert {str(event.pk) for event in waiting.context["cl"].result_list} == {
        str(events["failed"].pk)
    }


@pytest.mark.django_db
def test_attempts_endpoint_lists_the_records_oldest_first(viewer, log_relay_events, make_user):
    client = client_for(viewer)
    failed = log_relay_events["failed"]
    body = client.get(f"{API}{failed.pk}/attempts/").json()
    assert [
        (row["outcome"], row["duration_ms"], row["error_class"], row["error"])
        for row in body["results"]
    ] == [
        ("FAILED", 30_000, "MSG_TIMED_OUT", TIMED_OUT),
        ("FAILED", 0, "MSG_SIZE_TOO_LARGE", TOO_BIG),
    ]
    assert set(body["results"][0]) == ATTEMPT_FIELDS
    done = client.get(f"{API}{log_relay_events['done'].pk}/attempts/").json()["results"]
    assert [
        (r["outcome"], r["duration_ms"], r["kafka_partition"], r["kafka_offset"], r["error_class"])
        for r in done
    ] == [
        ("FAILED", None, None, None, "MSG_TIMED_OUT"),  # no duration: an older record
        ("PUBLISHED", 7, 2, 77, ""),
    ]
    assert done[0]["at"] < done[1]["at"]
    assert client.get(f"{API}{log_relay_events['pending'].pk}/attempts/").json()["results"] == []

    # Paginated like the other lists: a cursor, no count.
    for _ in range(3):
        record(failed, "FAILED", error=TIMED_OUT)
    seen, url = [], f"{API}{failed.pk}/attempts/?page_size=2"
    while url:
        page = client.get(url).json()
        assert "count" not in page
        seen.extend(row["id"] for row in page["results"])
        url = page["next"]
    assert seen == sorted(seen)
    assert len(seen) == 5

    missing = client.get(f"{API}{uuid.uuid4()}/attempts/")
    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"
    assert client.get(f"{API}nope/attempts/").json()["code"] == "invalid_id"
    assert client_for(make_user()).get(f"{API}{failed.pk}/attempts/").status_code == 403


@pytest.mark.django_db
def test_the_schema_documents_the_attempts_endpoint(viewer):
    schema = json.loads(client_for(viewer).get("/api/schema/", {"format": "json"}).content)
    operation = schema["paths"]["/api/outbox/events/{id}/attempts/"]["get"]
    reference = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    page = schema["components"]["schemas"][reference.rsplit("/", 1)[1]]
    assert "next" in page["properties"]
    item = page["properties"]["results"]["items"]["$ref"].rsplit("/", 1)[1]
    properties = schema["components"]["schemas"][item]["properties"]
    assert set(properties) == ATTEMPT_FIELDS
    assert (properties["duration_ms"]["type"], properties["duration_ms"]["nullable"]) == (
        "integer",
        True,
    )
    assert properties["error_class"]["type"] == "string"
    assert all(properties[name]["readOnly"] for name in ("duration_ms", "error_class"))
    assert "milliseconds" in properties["duration_ms"]["description"]


# --- REST API: repairs ------------------------------------------------------------------------


@pytest.mark.django_db
def test_api_retry_and_discard_act_on_held_events(operator, log_relay_events):
    client = client_for(operator)
    failed, waiting = log_relay_events["failed"], log_relay_events["waiting"]

    refused = client.post(f"{API}{waiting.pk}/retry/", {}, format="json")
    assert refused.status_code == 409
    assert f"waits behind event {failed.pk}" in refused.json()["message"]

    retried = client.post(f"{API}{failed.pk}/retry/", {}, format="json")
    assert retried.status_code == 200, retried.json()
    assert retried.json()["status"] == "PENDING"
    held = OutboxHeldEvent.objects.get(event_id=failed.pk)
    assert held.attempts == 0
    assert held.next_attempt_at is not None
    refused = client.post(f"{API}{failed.pk}/discard/", {}, format="json")
    assert refused.status_code == 409
    assert "Only FAILED events can be discarded" in refused.json()["message"]

    OutboxHeldEvent.objects.filter(event_id=failed.pk).update(attempts=2, next_attempt_at=None)
    discarded = client.post(f"{API}{failed.pk}/discard/", {}, format="json")
    assert discarded.status_code == 200, discarded.json()
    assert discarded.json()["status"] == "FAILED"
    assert discarded.json()["discarded_at"] is not None
    assert not OutboxHeldEvent.objects.filter(event_id=failed.pk).exists()
    assert list(
        OutboxDelivery.objects.filter(event_id=failed.pk).order_by("id").values_list("outcome")
    ) == [("FAILED",), ("FAILED",), ("DISCARDED",)]
    history = client.get(f"{API}{failed.pk}/attempts/").json()["results"]
    assert [(row["outcome"], row["relay"]) for row in history][-1] == ("DISCARDED", "operator")


@pytest.mark.django_db
def test_api_bulk_actions_by_filter_select_by_the_delivery(operator, log_relay_events):
    client = client_for(operator)
    dry = client.post(
        f"{API}bulk/retry/", {"filter": {"status": "FAILED"}, "dry_run": True}, format="json"
    ).json()
    assert dry["matched"] == 2  # the spent head and the discarded event
    result = client.post(
        f"{API}bulk/retry/",
        {"filter": {"status": "FAILED", "discarded": "false"}, "reason": "relay fixed"},
        format="json",
    ).json()
    assert (result["matched"], result["changed"]) == (1, 1)
    assert OperatorAction.objects.get().object_ids == [str(log_relay_events["failed"].pk)]
    assert OutboxHeldEvent.objects.get(event_id=log_relay_events["failed"].pk).attempts == 0

    replay = client.post(
        f"{API}bulk/replay/", {"filter": {"status": "DONE"}, "dry_run": True}, format="json"
    ).json()
    assert replay["matched"] == 1


# --- admin ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_list_shows_and_filters_the_delivery(viewer, log_relay_events):
    client = logged_in(viewer)

    def listed(**query):
        html = client.get(ADMIN, query).content.decode()
        return {name for name, event in log_relay_events.items() if str(event.pk) in html}

    html = client.get(ADMIN).content.decode()
    assert "FAILED (discarded)" in html
    assert ">DONE<" in html
    assert 'name="published_at_from_0"' in html  # the publication time's range filter
    assert listed(status__exact="DONE") == {"done"}
    assert listed(status__exact="FAILED") == {"failed", "discarded"}
    assert listed(status__exact="PENDING") == {"waiting", "pending"}
    assert listed(status__exact="discarded") == {"discarded"}
    published = timezone.localtime(OutboxDelivery.objects.get(outcome="PUBLISHED").published_at)
    before = published - timedelta(minutes=1)
    assert listed(
        published_at_from_0=before.strftime("%Y-%m-%d"),
        published_at_from_1=before.strftime("%H:%M:%S"),
    ) == {"done"}


LIST_QUERIES = {
    "all": {},
    "failed": {"status__exact": "FAILED"},
    "done": {"status__exact": "DONE"},
    "discarded": {"status__exact": "discarded"},
}


@pytest.mark.django_db
def test_admin_list_reads_the_delivery_without_a_query_per_row(
    viewer, log_relay_events, make_event
):
    client = logged_in(viewer)

    def queries(**query):
        with CaptureQueriesContext(connection) as captured:
            assert client.get(ADMIN, query).status_code == 200
        return [q["sql"] for q in captured]

    before = {name: len(queries(**query)) for name, query in LIST_QUERIES.items()}
    for number in range(6):
        event = make_event(key=f"k-more-{number}")
        record(event, "PUBLISHED", partition=0, offset=number)
    after = {name: len(queries(**query)) for name, query in LIST_QUERIES.items()}
    assert after == before
    for sql in queries(status__exact="FAILED"):
        assert not ('"payload"' in sql and "outbox_event" in sql)


@pytest.mark.django_db
def test_admin_detail_shows_the_attempts_and_the_held_state(viewer, log_relay_events):
    client = logged_in(viewer)
    done = client.get(f"{ADMIN}{log_relay_events['done'].pk}/change/").content.decode()
    assert ">DONE<" in done
    assert (field(done, "Kafka partition"), field(done, "Kafka offset")) == ("2", "77")
    assert (field(done, "Attempts"), field(done, "Discarded at")) == ("2", "-")
    assert field(done, "Published at") != "-"
    assert "partition 2, offset 77" in done  # the timeline's published step
    records = OutboxDelivery.objects.filter(event_id=log_relay_events["done"].pk).order_by("id")
    first, published = (row.published_at.isoformat(timespec="milliseconds") for row in records)
    history = done[done.index("console-attempts") :]
    assert history.index(first) < history.index(published)
    assert history.index(TIMED_OUT) < history.index("PUBLISHED")
    assert [(row["Duration"], row["Error class"]) for row in attempt_rows(done)] == [
        ("unknown", "MSG_TIMED_OUT"),  # a record from before durations were kept
        ("7 ms", "-"),
    ]
    assert "No attempt yet." not in done

    failed = client.get(f"{ADMIN}{log_relay_events['failed'].pk}/change/").content.decode()
    assert "FAILED" in failed
    history = failed[failed.index("console-attempts") :]
    assert history.index(TIMED_OUT) < history.index(TOO_BIG)
    assert [(row["Duration"], row["Error class"]) for row in attempt_rows(failed)] == [
        ("30000 ms", "MSG_TIMED_OUT"),
        ("0 ms", "MSG_SIZE_TOO_LARGE"),
    ]
    assert "waiting for an operator" in field(failed, "Next attempt")
    assert field(failed, "Attempts") == "2"
    assert TOO_BIG in field(failed, "Last error")
    assert (field(failed, "Published at"), field(failed, "Kafka offset")) == ("-", "-")
    assert "Held since" in failed
    assert "Waits behind" not in failed  # it is the head

    waiting = client.get(f"{ADMIN}{log_relay_events['waiting'].pk}/change/").content.decode()
    assert "Waits behind" in waiting
    assert f'href="{ADMIN}{log_relay_events["failed"].pk}/change/"' in waiting

    discarded = client.get(f"{ADMIN}{log_relay_events['discarded'].pk}/change/").content.decode()
    assert "FAILED (discarded)" in discarded
    assert field(discarded, "Discarded at") != "-"
    assert "DISCARDED" in discarded[discarded.index("console-attempts") :]
    assert [(row["Outcome"], row["Duration"]) for row in attempt_rows(discarded)][-1] == (
        "DISCARDED",
        "-",  # not a try
    )

    pending = client.get(f"{ADMIN}{log_relay_events['pending'].pk}/change/").content.decode()
    assert ">PENDING<" in pending
    assert (field(pending, "Attempts"), field(pending, "Next attempt")) == ("0", "-")
    assert field(pending, "Held back") == "-"
    assert "No attempt yet." in pending


@pytest.mark.django_db
def test_admin_detail_errors_are_escaped(viewer, make_event):
    event = make_event()
    record(event, "FAILED", error="<script>alert(1)</script>")
    html = logged_in(viewer).get(f"{ADMIN}{event.pk}/change/").content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.django_db
def test_admin_detail_offers_the_repairs_the_delivery_allows(operator, log_relay_events):
    client = logged_in(operator)

    def offered(name):
        pk = log_relay_events[name].pk
        html = client.get(f"{ADMIN}{pk}/change/").content.decode()
        verbs = ("retry", "discard", "replay-same-id", "replay-new-id", "release-key")
        return {verb for verb in verbs if f"{ADMIN}{pk}/{verb}/" in html}

    assert offered("failed") == {"retry", "discard", "release-key"}
    assert offered("done") == {"replay-same-id", "replay-new-id", "release-key"}
    assert offered("discarded") == {"replay-same-id", "replay-new-id", "release-key"}
    assert offered("waiting") == {"release-key"}


@pytest.mark.django_db
def test_admin_retry_and_discard_act_on_held_events(operator, log_relay_events):
    client = logged_in(operator)
    failed = log_relay_events["failed"]
    confirm = client.get(f"{ADMIN}{failed.pk}/retry/").content.decode()
    assert "is FAILED" in confirm

    response = client.post(f"{ADMIN}{failed.pk}/retry/", follow=True)
    assert f"Retry: event {failed.pk} is PENDING." in response.content.decode()
    held = OutboxHeldEvent.objects.get(event_id=failed.pk)
    assert (held.attempts, held.next_attempt_at is not None) == (0, True)

    OutboxHeldEvent.objects.filter(event_id=failed.pk).update(attempts=2, next_attempt_at=None)
    response = client.post(
        ADMIN,
        {"action": "discard_selected", "_selected_action": [str(failed.pk)], "reason": "spent"},
        follow=True,
    )
    assert "Discard: 1 of 1 selected" in response.content.decode()
    assert not OutboxHeldEvent.objects.filter(event_id=failed.pk).exists()
    assert OutboxDelivery.objects.filter(event_id=failed.pk).latest("id").outcome == "DISCARDED"
    page = client.get(f"{ADMIN}{failed.pk}/change/").content.decode()
    assert "FAILED (discarded)" in page

    again = client.post(f"{ADMIN}{failed.pk}/discard/", follow=True).content.decode()
    assert f"Event {failed.pk} is already discarded." in again


@pytest.mark.django_db
def test_admin_retry_matching_selects_by_the_delivery(operator, log_relay_events):
    client = logged_in(operator)
    confirm = client.get(f"{ADMIN}retry-matching/", {"status__exact": "FAILED"})
    assert confirm.context["count"] == 2
    response = client.post(
        f"{ADMIN}retry-matching/",
        {"_changelist_filters": "status__exact=FAILED", "reason": "relay fixed"},
    )
    assert response.status_code == 302
    entry = OperatorAction.objects.get()
    assert (entry.requested, entry.changed) == (2, 1)  # the discarded one is skipped
    assert OutboxHeldEvent.objects.get(event_id=log_relay_events["failed"].pk).attempts == 0


@pytest.mark.django_db
def test_release_key_counts_the_held_events(operator, log_relay_events):
    client = logged_in(operator)
    page = client.get(f"{ADMIN}release-key/", {"topic": "console.orders", "key": "k-failed"})
    assert (page.context["failed"], page.context["waiting"]) == (1, 2)
    client.post(f"{ADMIN}release-key/", {"topic": "console.orders", "key": "k-failed"})
    assert not OutboxHeldEvent.objects.filter(event_id=log_relay_events["failed"].pk).exists()
    page = client.get(f"{ADMIN}release-key/", {"topic": "console.orders", "key": "k-failed"})
    assert (page.context["failed"], page.context["waiting"]) == (0, 1)


# --- a real relay -----------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_pages_show_what_a_real_relay_recorded(
    kafka_topic, kafka_consumer_config, size_limited_log_relay, settings, make_user
):
    user = make_user(*VIEW_PERMISSIONS, "outbox.retry_outboxevent", "outbox.discard_outboxevent")
    api, admin = client_for(user), logged_in(user)
    topic = kafka_topic()
    sent = publish_numbered(topic, "a", 0)
    head = publish_numbered(topic, "b", 0, too_large=True)
    started = time.monotonic()

    def elapsed_ms() -> float:
        return (time.monotonic() - started) * 1000

    behind = publish_numbered(topic, "b", 1)
    size_limited_log_relay.run()
    OutboxHeldEvent.objects.filter(attempts__gt=0).update(next_attempt_at=timezone.now())
    size_limited_log_relay.run()  # the head's second and last attempt

    [message] = consume_all(kafka_consumer_config, topic, expected=1)
    rows = {row["id"]: row for row in api.get(API, {"topic": topic}).json()["results"]}
    assert rows[str(sent.pk)]["status"] == "DONE"
    assert rows[str(sent.pk)]["kafka_partition"] == message.partition()
    assert rows[str(sent.pk)]["kafka_offset"] == message.offset()
    assert (rows[str(head.pk)]["status"], rows[str(head.pk)]["attempts"]) == ("FAILED", 2)
    assert "MSG_SIZE_TOO_LARGE" in rows[str(head.pk)]["last_error"]
    assert rows[str(behind.pk)]["status"] == "PENDING"
    assert {row["id"] for row in api.get(API, {"status": "FAILED"}).json()["results"]} == {
        str(head.pk)
    }

    attempts = api.get(f"{API}{head.pk}/attempts/").json()["results"]
    assert [row["outcome"] for row in attempts] == ["FAILED", "FAILED"]
    assert all("MSG_SIZE_TOO_LARGE" in row["error"] for row in attempts)
    # Refused by the producer at once: the class of the refusal, and no wait for a broker.
    assert [row["error_class"] for row in attempts] == ["MSG_SIZE_TOO_LARGE"] * 2
    assert all(0 <= row["duration_ms"] <= 500 for row in attempts), attempts
    assert [row["relay"] for row in attempts] == [size_limited_log_relay.relay_id] * 2
    [published_try] = api.get(f"{API}{sent.pk}/attempts/").json()["results"]
    assert (published_try["outcome"], published_try["error_class"]) == ("PUBLISHED", "")
    assert 0 <= published_try["duration_ms"] <= elapsed_ms(), published_try

    html = admin.get(ADMIN, {"status__exact": "FAILED", "topic": topic}).content.decode()
    assert str(head.pk) in html
    assert str(behind.pk) not in html
    detail = admin.get(f"{ADMIN}{head.pk}/change/").content.decode()
    assert detail.count("MSG_SIZE_TOO_LARGE") >= 2
    assert [(row["Duration"], row["Error class"]) for row in attempt_rows(detail)] == [
        (f"{row['duration_ms']} ms", "MSG_SIZE_TOO_LARGE") for row in attempts
    ]
    assert "waiting for an operator" in detail
    behind_page = admin.get(f"{ADMIN}{behind.pk}/change/").content.decode()
    assert f'href="{ADMIN}{head.pk}/change/"' in behind_page
    published = admin.get(f"{ADMIN}{sent.pk}/change/").content.decode()
    assert f"partition {message.partition()}, offset {message.offset()}" in published
    assert [(row["Duration"], row["Error class"]) for row in attempt_rows(published)] == [
        (f"{published_try['duration_ms']} ms", "-")
    ]

    # Retry through the API once the limit is lifted: the relay sends the key in order.
    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {}}
    close_producers()
    retried = api.post(f"{API}{head.pk}/retry/", {}, format="json")
    assert retried.status_code == 200, retried.json()
    assert retried.json()["status"] == "PENDING"
    size_limited_log_relay.run()
    assert not OutboxHeldEvent.objects.exists()
    attempts = api.get(f"{API}{head.pk}/attempts/").json()["results"]
    assert [row["outcome"] for row in attempts] == ["FAILED", "FAILED", "PUBLISHED"]
    detail = api.get(f"{API}{head.pk}/").json()
    assert (detail["status"], detail["kafka_offset"]) == ("DONE", attempts[-1]["kafka_offset"])
    html = admin.get(ADMIN, {"status__exact": "DONE", "topic": topic}).content.decode()
    assert all(str(event.pk) in html for event in (sent, head, behind))


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_an_admin_discard_of_a_real_failed_head_lets_its_key_go_on(
    kafka_topic, size_limited_log_relay, make_user
):
    user = make_user(*VIEW_PERMISSIONS, "outbox.discard_outboxevent")
    admin = logged_in(user)
    topic = kafka_topic()
    head = publish_numbered(topic, "c", 0, too_large=True)
    behind = publish_numbered(topic, "c", 1)
    size_limited_log_relay.run()
    OutboxHeldEvent.objects.filter(attempts__gt=0).update(next_attempt_at=timezone.now())
    size_limited_log_relay.run()

    response = admin.post(f"{ADMIN}{head.pk}/discard/", follow=True)
    assert f"Discard: event {head.pk} is FAILED (discarded)." in response.content.decode()
    assert not OutboxHeldEvent.objects.filter(event_id=head.pk).exists()
    assert size_limited_log_relay.run().published == 1
    outcomes = list(
        OutboxDelivery.objects.filter(event_id=head.pk).order_by("id").values_list("outcome")
    )
    assert outcomes == [("FAILED",), ("FAILED",), ("DISCARDED",)]
    detail = admin.get(f"{ADMIN}{head.pk}/change/").content.decode()
    assert "FAILED (discarded)" in detail
    history = detail[detail.index("console-attempts") :]
    assert history.index("FAILED</td>") < history.index("DISCARDED</td>")
    assert ">DONE<" in admin.get(f"{ADMIN}{behind.pk}/change/").content.decode()
