"""The admin with Django's test client: the dashboard, lists and details, every action with
its permission, the retry of everything matching a filter, and the audit log."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.models import BulkOperation, OperatorAction
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from outbox.selectors import outbox_event_delivered, outbox_events_with_delivery
from tests.console.conftest import VIEW_PERMISSIONS, hold, logged_in

pytestmark = pytest.mark.django_db

EVENTS = "/admin/outbox/outboxevent/"
MESSAGES = "/admin/inbox/inboxmessage/"


def delivery(event):
    """`event` with its delivery as users see it, read now."""
    return outbox_event_delivered(event_id=event.pk)


@pytest.fixture
def kafka_unreachable(settings):
    settings.KAFKA_EVENTS = {**settings.KAFKA_EVENTS, "BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    settings.CONSOLE_KAFKA_TIMEOUT_SECONDS = 0.5
    settings.CONSOLE_CONSUMER_GROUPS = ["billing"]


def test_dashboard_shows_counts_failures_keys_and_health(
    operator, make_event, make_message, kafka_unreachable
):
    make_event(OutboxEvent.Status.FAILED, key="order-9", error="MSG_TIMED_OUT: Local: timed out")
    hold(make_event(OutboxEvent.Status.PENDING, key="order-9"))  # behind the failed head
    make_event(OutboxEvent.Status.DONE)
    make_message(InboxMessage.Status.FAILED, duplicate_count=2)
    response = logged_in(operator).get("/admin/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Outbox FAILED" in html
    assert "Oldest pending event" in html
    assert "MSG_TIMED_OUT" in html
    assert "demo.errors.DemoFailure" in html
    assert "order-9" in html  # quarantined key
    assert 'id="kafka-unreachable"' in html  # a state, not an error page
    for part in ("PostgreSQL", "Kafka", "Redis", "Celery beat", "Relay"):
        assert part in html
    assert 'data-type="line"' in html
    assert 'data-type="bar"' in html
    assert "https://" not in "".join(
        line for line in html.splitlines() if "<script" in line or "<link" in line
    )


@pytest.mark.kafka
def test_dashboard_reads_consumer_lag_from_kafka(operator, kafka_topic, settings):
    from confluent_kafka import Consumer, Producer, TopicPartition

    from kafka_events.kafka import kafka_connection_config

    topic = kafka_topic(partitions=2)
    producer = Producer(kafka_connection_config())
    for number in range(5):
        producer.produce(topic, value=b"{}", partition=number % 2)
    producer.flush(10)
    consumer = Consumer({**kafka_connection_config(), "group.id": "console-lag-test"})
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    consumer.close()
    settings.CONSOLE_CONSUMER_GROUPS = ["console-lag-test"]
    html = logged_in(operator).get("/admin/").content.decode()
    assert "kafka-unreachable" not in html
    assert topic in html
    assert "console-lag-test" in html


def test_outbox_list_filters_and_searches(viewer, make_event):
    failed = make_event(OutboxEvent.Status.FAILED, event_type="OrderCancelled")
    done = make_event(OutboxEvent.Status.DONE, key="order-abc")
    client = logged_in(viewer)
    html = client.get(EVENTS, {"status__exact": "FAILED"}).content.decode()
    assert str(failed.pk) in html
    assert str(done.pk) not in html
    html = client.get(EVENTS, {"event_type": "OrderCancelled"}).content.decode()
    assert str(failed.pk) in html
    assert str(done.pk) not in html
    html = client.get(EVENTS, {"q": "order-abc"}).content.decode()
    assert str(done.pk) in html
    assert str(failed.pk) not in html
    html = client.get(EVENTS, {"q": str(failed.pk)}).content.decode()
    assert str(failed.pk) in html


def test_a_deep_list_page_shows_its_rows_in_order_and_reads_the_delivery_of_those_alone(
    viewer, make_event, monkeypatch
):
    from console.admin.outbox import OutboxEventAdmin

    monkeypatch.setattr(OutboxEventAdmin, "list_per_page", 3)
    statuses = (OutboxEvent.Status.FAILED, OutboxEvent.Status.DONE)
    events = [make_event(statuses[number % 2], key=f"page-{number}") for number in range(7)]
    client = logged_in(viewer)

    with CaptureQueriesContext(connection) as captured:
        html = client.get(EVENTS, {"p": "2"}).content.decode()

    # Newest first: page 1 holds events 6, 5, 4; page 2 events 3, 2, 1.
    shown = [str(events[number].pk) for number in (3, 2, 1)]
    assert all(event_id in html for event_id in shown)
    assert [html.index(event_id) for event_id in shown] == sorted(
        html.index(event_id) for event_id in shown
    )
    assert str(events[4].pk) not in html
    assert str(events[0].pk) not in html
    assert ">DONE<" in html
    assert ">FAILED<" in html
    # The rows OFFSET skips are found by their keys alone: their delivery is never computed.
    # (The paging OFFSET ends the query; "OFFSET 0" inside keeps an EXISTS a per-row probe.)
    skipping = [query["sql"] for query in captured if re.search(r"OFFSET [1-9]\d*$", query["sql"])]
    assert skipping
    assert all("outbox_delivery" not in sql for sql in skipping)
    # The page's rows are read by their day and place in commit order (the relay's B-tree
    # index), not by id alone: the id's BRIN index reads thousands of rows of each partition.
    reading = [sql for sql in (query["sql"] for query in captured) if "delivery_status" in sql]
    assert len(reading) == 1
    assert reading[0].count('"outbox_event"."txid" = ') == 3
    assert reading[0].count('"outbox_event"."created_at" = ') == 3


def test_a_filter_that_fits_on_one_page_reads_the_event_table_once(viewer, make_event):
    # A rare value no index serves: every read of the filtered list walks the event table.
    # Its first page's ids, read before the count, are its count and its rows.
    rare = [make_event(event_type="RareEvent", key=f"rare-{number}") for number in range(2)]
    make_event(event_type="CommonEvent")

    with CaptureQueriesContext(connection) as captured:
        html = logged_in(viewer).get(EVENTS, {"event_type": "RareEvent"}).content.decode()

    shown = [str(event.pk) for event in reversed(rare)]  # newest first
    assert [html.index(event_id) for event_id in shown] == sorted(
        html.index(event_id) for event_id in shown
    )
    filtered = [query["sql"] for query in captured if "RareEvent" in query["sql"]]
    assert len(filtered) == 1, filtered
    assert "COUNT(" not in filtered[0]
    assert "2 results" in " ".join(html.split())


def test_outbox_list_filters_discarded_events_and_the_publication_time(viewer, make_event):
    from datetime import timedelta

    from django.utils import timezone

    failed = make_event(OutboxEvent.Status.FAILED)
    discarded = make_event(OutboxEvent.Status.FAILED, discarded_at=timezone.now())
    old = make_event(OutboxEvent.Status.DONE, published_at=timezone.now() - timedelta(days=2))
    recent = make_event(OutboxEvent.Status.DONE)
    client = logged_in(viewer)

    def listed(**query):
        html = client.get(EVENTS, query).content.decode()
        return {event for event in (failed, discarded, old, recent) if str(event.pk) in html}

    assert listed(status__exact="FAILED") == {failed, discarded}
    assert listed(status__exact="discarded") == {discarded}
    assert listed(status__exact="DONE") == {old, recent}
    since = timezone.localtime() - timedelta(days=1)
    assert listed(
        published_at_from_0=since.strftime("%Y-%m-%d"),
        published_at_from_1=since.strftime("%H:%M:%S"),
    ) == {recent}
    assert "FAILED (discarded)" in client.get(EVENTS).content.decode()


def test_outbox_detail_offers_the_repairs_the_status_allows(operator, make_event):
    client = logged_in(operator)

    def offered(event):
        html = client.get(f"{EVENTS}{event.pk}/change/").content.decode()
        verbs = ("retry", "discard", "replay-same-id", "replay-new-id", "release-key")
        return {verb for verb in verbs if f"{EVENTS}{event.pk}/{verb}/" in html}

    assert offered(make_event(OutboxEvent.Status.FAILED)) == {"retry", "discard", "release-key"}
    assert offered(make_event(OutboxEvent.Status.DONE)) == {
        "replay-same-id",
        "replay-new-id",
        "release-key",
    }
    assert offered(make_event(OutboxEvent.Status.PENDING, attempts=3)) == {"retry", "release-key"}
    assert offered(make_event(OutboxEvent.Status.PENDING)) == {"release-key"}


def test_outbox_list_never_counts_the_whole_table(
    viewer, make_event, django_assert_max_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    make_event()
    with CaptureQueriesContext(connection) as queries:
        assert logged_in(viewer).get(EVENTS).status_code == 200
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    # Only a capped count (a LIMIT in a subquery) or none at all.
    assert all("LIMIT" in sql.upper() for sql in counts), counts
    assert not [q["sql"] for q in queries if '"payload"' in q["sql"] and "outbox_event" in q["sql"]]


def test_outbox_detail_shows_json_kafka_position_and_timeline(
    payload_viewer, make_event, make_message
):
    event = make_event(OutboxEvent.Status.DONE)
    make_message(event_id=str(event.pk), group="billing")
    make_message(InboxMessage.Status.FAILED, event_id=str(event.pk), group="shipping")
    response = logged_in(payload_viewer).get(f"{EVENTS}{event.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "&quot;amount&quot;: &quot;12.50&quot;" in html  # pretty-printed JSON
    assert "&quot;tenant&quot;: &quot;acme&quot;" in html
    assert "partition 0, offset 41" in html
    assert "billing" in html
    assert "shipping" in html


def test_a_detail_page_reads_the_event_and_computes_each_field_once(
    viewer, make_event, make_message
):
    event = make_event(OutboxEvent.Status.FAILED, key="order-once")
    hold(make_event(OutboxEvent.Status.PENDING, key="order-once"))
    make_message(event_id=str(event.pk), group="billing")
    with CaptureQueriesContext(connection) as captured:
        response = logged_in(viewer).get(f"{EVENTS}{event.pk}/change/")
    assert response.status_code == 200
    statements = [query["sql"] for query in captured]
    # The event with its delivery, once: the detail actions offered ask for it again.
    assert sum("delivery_status" in sql for sql in statements) == 1
    # Unfold's read-only field asks for its contents several times a render: the held row,
    # the attempts and the timeline are each read once.
    held_row = (
        'SELECT "outbox_held_event"."id", "outbox_held_event"."event_id", '
        '"outbox_held_event"."shard"'
    )
    assert sum(sql.startswith(held_row) for sql in statements) == 1
    assert sum(sql.startswith('SELECT "outbox_delivery"."id"') for sql in statements) == 1
    assert sum('FROM "inbox_message"' in sql for sql in statements) == 1


def test_inbox_list_and_detail(viewer, make_message):
    failed = make_message(InboxMessage.Status.FAILED, group="shipping")
    client = logged_in(viewer)
    html = client.get(MESSAGES, {"status__exact": "FAILED", "consumer_group": "shipping"})
    assert f"{MESSAGES}{failed.pk}/change/" in html.content.decode()
    detail = client.get(f"{MESSAGES}{failed.pk}/change/").content.decode()
    assert "DemoFailure" in detail


def test_inbox_detail_links_its_outbox_event_found_without_ordering(
    viewer, make_event, make_message
):
    event = make_event(OutboxEvent.Status.DONE)
    consumed = make_message(event_id=str(event.pk), group="billing")
    foreign = make_message(group="billing")
    client = logged_in(viewer)
    with CaptureQueriesContext(connection) as queries:
        html = client.get(f"{MESSAGES}{consumed.pk}/change/").content.decode()
    assert f'href="{EVENTS}{event.pk}/change/">{event.pk} (timeline)</a>' in html
    # An ORDER BY would have PostgreSQL walk the commit-order index of every partition.
    lookups = [q["sql"] for q in queries if 'FROM "outbox_event"' in q["sql"]]
    assert lookups
    assert not [sql for sql in lookups if "ORDER BY" in sql]
    html = client.get(f"{MESSAGES}{foreign.pk}/change/").content.decode()
    assert "not in this database" in html


def test_retry_all_matching_is_offered_to_those_who_may_retry(make_user, make_message):
    make_message(InboxMessage.Status.FAILED)
    failed = {"status__exact": "FAILED"}
    viewer = logged_in(make_user(*VIEW_PERMISSIONS))
    assert "retry-matching" not in viewer.get(MESSAGES, failed).content.decode()
    retrier = logged_in(make_user(*VIEW_PERMISSIONS, "inbox.retry_inboxmessage"))
    link = f'href="{MESSAGES}retry-matching/?status__exact=FAILED"'
    assert link in retrier.get(MESSAGES, failed).content.decode()


def _post_action(client, url, action, ids):
    return client.post(
        url,
        {"action": action, "_selected_action": [str(i) for i in ids], "reason": "ticket 7"},
    )


@pytest.mark.parametrize(
    ("action", "status", "permission", "check"),
    [
        (
            "retry_selected",
            "FAILED",
            "outbox.retry_outboxevent",
            lambda e: e.delivery_status == "PENDING",
        ),
        (
            "discard_selected",
            "FAILED",
            "outbox.discard_outboxevent",
            lambda e: e.delivery_discarded_at,
        ),
        (
            "replay_same_id",
            "DONE",
            "outbox.replay_outboxevent",
            lambda e: e.delivery_status == "PENDING",
        ),
    ],
)
def test_outbox_actions_need_their_permission_and_are_audited(
    make_user, make_event, action, status, permission, check
):
    event = make_event(status)
    without = logged_in(make_user(*VIEW_PERMISSIONS))
    _post_action(without, EVENTS, action, [event.pk])
    assert delivery(event).delivery_status == status
    assert delivery(event).delivery_discarded_at is None
    assert not OperatorAction.objects.exists()

    with_permission = logged_in(make_user(*VIEW_PERMISSIONS, permission, username="ops"))
    response = _post_action(with_permission, EVENTS, action, [event.pk])
    assert response.status_code == 302
    assert check(delivery(event))
    entry = OperatorAction.objects.get()
    assert (entry.username, entry.source, entry.requested, entry.changed) == ("ops", "admin", 1, 1)
    assert entry.object_ids == [str(event.pk)]


def test_replay_with_a_new_event_id_from_the_detail_page(operator, make_event):
    event = make_event(OutboxEvent.Status.DONE)
    client = logged_in(operator)
    confirm = client.get(f"{EVENTS}{event.pk}/replay-new-id/")
    assert confirm.status_code == 200
    assert 'method="post"' in confirm.content.decode()
    assert OutboxEvent.objects.count() == 1, "a GET must not replay"
    assert not OperatorAction.objects.exists()
    response = client.post(f"{EVENTS}{event.pk}/replay-new-id/")
    assert response.status_code == 302
    copy = OutboxEvent.objects.exclude(pk=event.pk).get()
    assert copy.headers["replay_of"] == str(event.pk)
    assert response.url == f"{EVENTS}{copy.pk}/change/"
    assert OperatorAction.objects.get().action == OperatorAction.Action.OUTBOX_REPLAY_NEW_ID


def test_detail_actions_need_their_permission(viewer, make_event):
    event = make_event(OutboxEvent.Status.FAILED)
    assert logged_in(viewer).get(f"{EVENTS}{event.pk}/retry/").status_code == 403
    assert logged_in(viewer).post(f"{EVENTS}{event.pk}/retry/").status_code == 403


def test_a_detail_action_on_a_malformed_or_unknown_id_is_a_message(operator):
    client = logged_in(operator)
    for object_id in ("not-a-uuid", "7c9e6679-7425-40de-944b-e07fc1f90ae7"):
        response = client.post(f"{EVENTS}{object_id}/retry/", follow=True)
        assert response.status_code == 200
        assert f"No event with the id &#x27;{object_id}&#x27;" in response.content.decode()
    response = client.post(f"{MESSAGES}12x/discard/", follow=True)
    assert "No message with the id &#x27;12x&#x27;" in response.content.decode()


def test_release_key_from_the_detail_page_keeps_the_key_whole(operator, make_event):
    event = make_event(OutboxEvent.Status.FAILED, key="a&b #1+2")
    response = logged_in(operator).get(f"{EVENTS}{event.pk}/release-key/")
    assert response.status_code == 302
    confirm = logged_in(operator).get(response.url)
    assert "a&amp;b #1+2" in confirm.content.decode()


def test_a_refused_transition_is_a_message_not_an_error_page(operator, make_event):
    event = make_event(OutboxEvent.Status.DONE)
    response = logged_in(operator).post(f"{EVENTS}{event.pk}/retry/", follow=True)
    assert response.status_code == 200
    assert "replay it instead" in response.content.decode()


def test_the_retry_matching_confirmation_counts_no_further_than_the_count_limit(
    operator, make_event, settings
):
    settings.CONSOLE_COUNT_LIMIT = 3
    for _ in range(5):
        make_event(OutboxEvent.Status.FAILED)
    with CaptureQueriesContext(connection) as queries:
        confirm = logged_in(operator).get(f"{EVENTS}retry-matching/", {"status__exact": "FAILED"})
    assert confirm.status_code == 200
    assert (confirm.context["count"], confirm.context["count_is_exact"]) == (3, False)
    page = " ".join(confirm.content.decode().split())
    assert "more than 3" in page
    assert "every matching row" in page
    counts = [query["sql"] for query in queries.captured_queries if "COUNT(" in query["sql"]]
    assert counts
    assert all("LIMIT 4" in sql for sql in counts)


def test_a_list_says_when_its_count_is_an_estimate_or_where_counting_stopped(
    operator, make_message, settings, monkeypatch
):
    from console.admin.inbox import InboxMessageAdmin

    monkeypatch.setattr(InboxMessageAdmin, "list_per_page", 2)
    settings.CONSOLE_COUNT_LIMIT = 3
    for _ in range(5):
        make_message(InboxMessage.Status.FAILED)
    make_message(InboxMessage.Status.DONE)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE inbox_message")  # as autovacuum does: the estimate is 6 rows
    client = logged_in(operator)

    def counts(**filters: str) -> list[str]:
        """The count as the header ("N results"), the count under the list ("N inbox
        messages") and the actions bar ("Select all N", "All N selected") say it."""
        page = client.get(MESSAGES, filters).content.decode()
        found = [
            re.search(r"([^>]*) results \(", page),
            re.search(r'id="result-count">(.*?)</div>', page, re.S),
            re.search(r"Select all (.*?) inbox messages", page, re.S),
            re.search(r'class="all hidden">(.*?)</span>', page, re.S),
        ]
        return [" ".join(match.group(1).split()) if match else "" for match in found]

    # The whole table: PostgreSQL's estimate, past the limit.
    assert counts() == ["about 6", "- about 6 inbox messages", "about 6", "All about 6 selected"]
    # A filter: counted up to the limit and no further.
    more = "more than 3"
    assert counts(status__exact="FAILED") == [
        more,
        f"- {more} inbox messages",
        more,
        f"All {more} selected",
    ]
    # Within the limit, exact.
    settings.CONSOLE_COUNT_LIMIT = 10
    assert counts(status__exact="FAILED") == ["5", "- 5 inbox messages", "5", "All 5 selected"]


def test_retry_matching_counts_confirms_and_freezes_the_ids(
    operator, make_event, settings, monkeypatch, django_capture_on_commit_callbacks
):
    from console import tasks

    settings.CONSOLE_BULK_CHUNK_SIZE = 2  # 5 rows: 3 chunks through Celery
    for _ in range(5):
        make_event(OutboxEvent.Status.FAILED, topic="console.payments")
    other = make_event(OutboxEvent.Status.FAILED, topic="console.other")
    client = logged_in(operator)
    list_html = client.get(EVENTS, {"status__exact": "FAILED"}).content.decode()
    assert "retry-matching/?status__exact=FAILED" in list_html
    confirm = client.get(
        f"{EVENTS}retry-matching/", {"status__exact": "FAILED", "topic": "console.payments"}
    )
    assert confirm.status_code == 200
    assert confirm.context["count"] == 5
    # Hold the operation back, as a busy worker would.
    queued: list[int] = []
    monkeypatch.setattr(tasks.run_bulk_operation, "delay", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            f"{EVENTS}retry-matching/",
            {
                "_changelist_filters": "status__exact=FAILED&topic=console.payments",
                "reason": "after the broker upgrade",
            },
        )
    operation = BulkOperation.objects.get()
    assert queued == [operation.pk]
    # The operator lands on the operation's progress page, which reloads itself while queued.
    assert response.status_code == 302
    assert response.url == f"/admin/console/bulkoperation/{operation.pk}/change/"
    page = client.get(response.url).content.decode()
    assert 'http-equiv="refresh"' in page
    assert "0 of 3" in page
    assert (operation.status, operation.chunks_total, operation.chunks_done) == ("QUEUED", 3, 0)
    entry = OperatorAction.objects.get()
    assert (entry.requested, entry.changed, entry.chunks_pending) == (5, 0, 3)
    # An event that fails after the submit matches the filter, but is not in the frozen ids.
    late = make_event(OutboxEvent.Status.FAILED, topic="console.payments")
    tasks.run_bulk_operation.apply(args=(operation.pk,))
    entry.refresh_from_db()
    operation.refresh_from_db()
    assert (entry.requested, entry.changed, entry.chunks_pending) == (5, 5, 0)
    assert (operation.status, operation.chunks_done, operation.rows_changed) == ("DONE", 3, 5)
    assert entry.filters == {"status__exact": ["FAILED"], "topic": ["console.payments"]}
    assert entry.reason == "after the broker upgrade"
    finished = client.get(f"/admin/console/bulkoperation/{operation.pk}/change/").content.decode()
    assert 'http-equiv="refresh"' not in finished
    assert delivery(late).delivery_status == delivery(other).delivery_status == "FAILED"
    payments = outbox_events_with_delivery(OutboxEvent.objects.filter(topic="console.payments"))
    assert payments.filter(delivery_status="PENDING").count() == 5


def test_retry_matching_needs_the_retry_permission(viewer):
    assert logged_in(viewer).get(f"{EVENTS}retry-matching/").status_code == 403


def test_release_key_confirms_then_releases(operator, make_event):
    blocked = make_event(OutboxEvent.Status.FAILED, key="order-5")
    waiting = make_event(OutboxEvent.Status.PENDING, key="order-5")
    hold(waiting)  # behind the failed head
    client = logged_in(operator)
    url = f"{EVENTS}release-key/"
    page = client.get(url, {"topic": "console.orders", "key": "order-5"})
    assert page.status_code == 200
    assert page.context["failed"] == 1
    response = client.post(url, {"topic": "console.orders", "key": "order-5", "note": "n"})
    assert response.status_code == 302
    assert delivery(blocked).delivery_discarded_at is not None
    assert delivery(waiting).delivery_status == "PENDING"
    assert OperatorAction.objects.get().action == OperatorAction.Action.OUTBOX_KEY_RELEASE


def test_release_key_needs_its_permission(make_user):
    user = make_user(*VIEW_PERMISSIONS, "outbox.retry_outboxevent")
    assert logged_in(user).get(f"{EVENTS}release-key/").status_code == 403


@pytest.mark.parametrize(
    ("action", "permission", "check"),
    [
        ("retry_selected", "inbox.retry_inboxmessage", lambda m: m.status == "PENDING"),
        ("replay_selected", "inbox.replay_inboxmessage", lambda m: m.status == "PENDING"),
        (
            "discard_selected",
            "inbox.discard_inboxmessage",
            lambda m: m.status == "FAILED" and m.discarded_at is not None,
        ),
    ],
)
def test_inbox_actions_need_their_permission(make_user, make_message, action, permission, check):
    message = make_message(InboxMessage.Status.FAILED)
    _post_action(logged_in(make_user(*VIEW_PERMISSIONS)), MESSAGES, action, [message.pk])
    message.refresh_from_db()
    assert message.status == "FAILED"
    assert message.discarded_at is None
    _post_action(
        logged_in(make_user(*VIEW_PERMISSIONS, permission)), MESSAGES, action, [message.pk]
    )
    message.refresh_from_db()
    assert check(message)
    entry = OperatorAction.objects.get()
    assert (entry.model, entry.changed) == ("inbox.InboxMessage", 1)


def test_a_discarded_inbox_message_says_so_on_its_page(operator, make_message):
    message = make_message(InboxMessage.Status.FAILED)
    client = logged_in(operator)
    assert client.get(f"{MESSAGES}{message.pk}/discard/").status_code == 200
    message.refresh_from_db()
    assert message.discarded_at is None, "a GET must not discard"
    response = client.post(f"{MESSAGES}{message.pk}/discard/")
    assert response.status_code == 302
    assert "FAILED (discarded)" in client.get(f"{MESSAGES}{message.pk}/change/").content.decode()
    again = client.post(f"{MESSAGES}{message.pk}/discard/", follow=True)
    assert "is already discarded" in again.content.decode()


def test_the_audit_log_is_readable_and_read_only(operator, make_event):
    event = make_event(OutboxEvent.Status.FAILED)
    client = logged_in(operator)
    _post_action(client, EVENTS, "retry_selected", [event.pk])
    entry = OperatorAction.objects.get()
    html = client.get("/admin/console/operatoraction/").content.decode()
    assert "outbox.retry" in html
    assert "operator" in html
    assert client.get(f"/admin/console/operatoraction/{entry.pk}/change/").status_code == 200
    assert client.post(f"/admin/console/operatoraction/{entry.pk}/delete/").status_code == 403
    assert client.get("/admin/console/operatoraction/add/").status_code == 403


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0123, "12.3 ms"),
        (0.99996, "1.00 s"),
        (1.2345, "1.23 s"),
        (59.996, "1 min 0 s"),
        (125.4, "2 min 5 s"),
        (-0.002, "-2.0 ms"),
    ],
)
def test_a_lag_reads_in_the_unit_its_size_calls_for(seconds, text):
    from datetime import UTC, datetime, timedelta

    from console.admin.base import lag_text

    started = datetime(2026, 1, 1, tzinfo=UTC)
    assert lag_text(started, started + timedelta(seconds=seconds)) == text
    assert lag_text(started, None) == "-"


def test_the_lists_show_lag_and_log_position(operator, make_event, make_message):
    make_event(OutboxEvent.Status.DONE)
    make_message(InboxMessage.Status.DONE)
    client = logged_in(operator)
    events = client.get(EVENTS)
    assert "Publish lag" in events.content.decode()
    assert "0/41" in events.content.decode()  # the fixture's partition and offset
    messages = client.get(MESSAGES)
    assert "Consume lag" in messages.content.decode()
    message = InboxMessage.objects.get()
    assert f"{message.partition}/{message.offset}" in messages.content.decode()
