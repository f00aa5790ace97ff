import itertools
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.test.utils import CaptureQueriesContext

import outbox
from outbox.errors import (
    DuplicateEvent,
    InvalidEvent,
    InvalidPayload,
    NotInTransaction,
    OutboxError,
    PayloadTooLarge,
)
from outbox.ids import time_ordered_event_id
from outbox.models import OutboxEvent
from outbox.selectors import outbox_event_delivered
from outbox.tracing import current_traceparent

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = {
    "aggregate_type": "payment",
    "aggregate_id": "p-1",
    "event_type": "PaymentCompleted",
    "payload": {"amount": "10.00"},
}


def test_publish_records_a_pending_event_with_the_defaults():
    with transaction.atomic():
        event = outbox.publish(**EVENT)
    stored = outbox_event_delivered(event_id=event.id)
    assert stored.delivery_status == OutboxEvent.Status.PENDING
    assert stored.topic == "outbox.event.payment"
    assert stored.key == "p-1"
    assert stored.payload == {"amount": "10.00"}
    assert stored.delivery_attempts == 0
    assert stored.position == event.position


def test_the_returned_event_is_the_stored_row_field_for_field():
    # publish() writes its row with a statement of its own, not Model.save(): every field of
    # the model must come back from the database as publish() returned it.
    with transaction.atomic():
        event = outbox.publish(**EVENT, headers={"tenant": "eu"})
    stored = OutboxEvent.objects.get(pk=event.pk)
    for field in OutboxEvent._meta.concrete_fields:
        assert getattr(event, field.attname) == getattr(stored, field.attname), field.name
    assert not event._state.adding
    event.save(update_fields=["headers"])  # usable as any model instance fetched


def test_the_debezium_column_names():
    with transaction.atomic():
        event = outbox.publish(**EVENT)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, aggregatetype, aggregateid, type, payload FROM outbox_event WHERE id = %s",
            [event.id],
        )
        row = cursor.fetchone()
    assert row[:4] == (event.id, "payment", "p-1", "PaymentCompleted")


def test_a_rolled_back_transaction_leaves_no_event():
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.publish(**EVENT)
        raise RuntimeError("business failure")
    assert not OutboxEvent.objects.exists()


def test_outside_a_transaction_publish_refuses_and_writes_nothing():
    with pytest.raises(NotInTransaction, match=r"transaction\.atomic\(\)"):
        outbox.publish(**EVENT)
    assert not OutboxEvent.objects.exists()


class Unserialisable:
    pass


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"payload": {"x": Unserialisable()}}, InvalidPayload, "not JSON-serialisable"),
        ({"payload": {"x": float("nan")}}, InvalidPayload, "not JSON-serialisable"),
        (
            {"payload": {"blob": "x" * (900 * 1024)}},
            PayloadTooLarge,
            re.escape('OUTBOX["MAX_PAYLOAD_BYTES"] allows 921600'),
        ),
        ({"aggregate_type": ""}, InvalidEvent, "aggregate_type must not be empty"),
        ({"aggregate_id": "  "}, InvalidEvent, "aggregate_id must not be empty"),
        ({"event_type": ""}, InvalidEvent, "event_type must not be empty"),
        ({"topic": "bad topic!"}, InvalidEvent, "Kafka would refuse the topic name"),
        ({"topic": "t" * 250}, InvalidEvent, "Kafka would refuse the topic name"),
        ({"topic": ".."}, InvalidEvent, "Kafka would refuse the topic name"),
        ({"aggregate_type": "has space"}, InvalidEvent, "Kafka would refuse the topic name"),
        ({"headers": {"event_id": "x"}}, InvalidEvent, "set by the outbox itself"),
        ({"headers": {"n": 1}}, InvalidEvent, "must be a string"),
        ({"event_id": "not-a-uuid"}, InvalidEvent, "is not a UUID"),
        ({"payload": {"note": "a\x00b"}}, InvalidPayload, "NUL character"),
        ({"payload": {"a\x00": 1}}, InvalidPayload, "NUL character"),
        ({"payload": {"note": "\ud800"}}, InvalidPayload, "lone surrogate"),
        ({"aggregate_id": "p\x001"}, InvalidEvent, "aggregate_id contains a NUL"),
        ({"key": "k\x00"}, InvalidEvent, "key contains a NUL"),
        ({"event_type": "Paid\ud800"}, InvalidEvent, "event_type contains a lone surrogate"),
        ({"headers": {"tenant": "eu\x00"}}, InvalidEvent, "header 'tenant' contains a NUL"),
    ],
)
def test_bad_input_raises_its_error_and_writes_nothing(changes, error, message):
    with transaction.atomic():
        with pytest.raises(error, match=message) as raised:
            outbox.publish(**{**EVENT, **changes})
        assert isinstance(raised.value, OutboxError)
        assert raised.value.code
        # The caller's transaction stays usable after the error.
        outbox.publish(**EVENT)
    assert OutboxEvent.objects.count() == 1


def test_text_that_only_looks_like_an_escaped_nul_is_stored():
    with transaction.atomic():
        event = outbox.publish(**{**EVENT, "payload": {"path": "C:\\u0000"}})
    event.refresh_from_db()
    assert event.payload == {"path": "C:\\u0000"}


def test_a_reused_event_id_raises_duplicate_event_and_keeps_the_transaction_usable():
    event_id = uuid.uuid4()
    with transaction.atomic():
        outbox.publish(**EVENT, event_id=event_id)
    with transaction.atomic():
        with pytest.raises(DuplicateEvent, match=str(event_id)):
            outbox.publish(**EVENT, event_id=str(event_id))
        outbox.publish(**EVENT)
    assert OutboxEvent.objects.count() == 2


def test_an_id_publish_drew_cannot_be_given_again():
    """Drawn ids are not in the given ids' table: publish() looks for a time-ordered id among
    the events of its time."""
    with transaction.atomic():
        drawn = outbox.publish(**EVENT)
    unused = time_ordered_event_id(drawn.created_at)
    with transaction.atomic():
        with pytest.raises(DuplicateEvent, match=str(drawn.id)):
            outbox.publish(**EVENT, event_id=drawn.id)
        outbox.publish(**EVENT, event_id=unused)
    assert set(OutboxEvent.objects.values_list("pk", flat=True)) == {drawn.id, unused}


def test_a_given_time_ordered_id_past_the_year_9999_is_taken():
    far_future = uuid.UUID("ffffffff-ffff-7fff-bfff-ffffffffffff")
    with transaction.atomic():
        assert outbox.publish(**EVENT, event_id=far_future).id == far_future


def test_explicit_topic_key_and_headers_are_kept():
    with transaction.atomic():
        event = outbox.publish(
            **EVENT, topic="payments.v2", key="merchant-7", headers={"tenant": "eu"}
        )
    assert (event.topic, event.key, event.headers) == (
        "payments.v2",
        "merchant-7",
        {"tenant": "eu"},
    )


def test_the_callers_traceparent_travels_with_the_event():
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    token = current_traceparent.set(traceparent)
    try:
        with transaction.atomic():
            event = outbox.publish(**EVENT)
    finally:
        current_traceparent.reset(token)
    assert event.headers["traceparent"] == traceparent


def test_positions_follow_creation_order():
    with transaction.atomic():
        events = [outbox.publish(**EVENT) for _ in range(5)]
    positions = [event.position for event in events]
    assert positions == sorted(positions)
    assert len(set(positions)) == 5


def test_the_size_limit_counts_the_bytes_the_relay_will_send(settings):
    from django.db import connection

    settings.OUTBOX = {**settings.OUTBOX, "MAX_PAYLOAD_BYTES": 1000}
    # Many small elements: the spaced form PostgreSQL prints is much longer than compact JSON.
    payload = {"items": [1] * 300}
    with transaction.atomic():
        with pytest.raises(PayloadTooLarge):
            outbox.publish(**{**EVENT, "payload": {"items": [1] * 400}})
        event = outbox.publish(**{**EVENT, "payload": payload})
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload::text FROM outbox_event WHERE id = %s", [event.id])
        sent = cursor.fetchone()[0].encode()
    assert len(sent) <= 1000
    assert len(sent) > len(b'{"items":[' + b",".join([b"1"] * 300) + b"]}")


def test_a_drawn_event_id_is_a_version_7_uuid_of_the_events_creation_time():
    with transaction.atomic():
        events = [outbox.publish(**EVENT) for _ in range(50)]
    for event in events:
        assert (event.id.version, event.id.variant) == (7, uuid.RFC_4122)
        milliseconds = (event.created_at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(
            milliseconds=1
        )
        assert event.id.int >> 80 == milliseconds
    # Rising with time: an event of a later millisecond has the greater id.
    for earlier, later in itertools.pairwise(events):
        if later.id.int >> 80 != earlier.id.int >> 80:
            assert later.id > earlier.id
    assert len({event.id for event in events}) == 50


def _prepared_statements() -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [statement for (statement,) in cursor.fetchall()]


def test_publish_prepares_its_insert_once_per_connection(settings):
    from django.db import connection

    connection.close()
    with transaction.atomic():
        for _ in range(3):
            outbox.publish(**EVENT)
    inserts = [s for s in _prepared_statements() if "INSERT INTO outbox_event " in s]
    assert len(inserts) == 1, inserts
    # While Django logs queries, the log shows the statement with its values.
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        event = outbox.publish(**EVENT)
    assert any(
        "INSERT INTO outbox_event " in query["sql"] and event.id.hex in query["sql"]
        for query in queries.captured_queries
    )
    # Django's own cursors are left as Django configured them: they never prepare.
    OutboxEvent.objects.filter(key="p-1").count()
    assert len(_prepared_statements()) == 1


def test_outbox_publish_prepared_off_prepares_nothing(settings):
    from django.db import connection

    settings.OUTBOX = {**settings.OUTBOX, "PUBLISH_PREPARED": False}
    connection.close()
    with transaction.atomic():
        event = outbox.publish(**EVENT)
    assert _prepared_statements() == []
    assert OutboxEvent.objects.filter(pk=event.pk).exists()
