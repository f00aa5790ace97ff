"""Order per key (inbox/services/sequences.py): with ordering "key", a failed message holds the
later messages of its key, PARKED, until it is done or an operator skips or releases it.
Against PostgreSQL, with records built in memory; test_ordering_consumer.py runs it through
Kafka."""

import time

import pytest
from confluent_kafka import Message
from django.db import connection
from django.utils import timezone

from inbox.errors import InvalidTransition
from inbox.models import ConsumerOffset, InboxMessage
from inbox.records import parse_record
from inbox.services.repairs import inbox_message_discard, inbox_message_replay
from inbox.services.retries import inbox_messages_retry, inbox_messages_retry_due
from inbox.services.sequences import (
    inbox_sequence_release,
    inbox_sequence_retry,
    inbox_sequence_skip_head,
    sequence_lock_name,
)
from tests.app_settings import override_app_settings
from tests.conftest import connect_outside_django
from tests.inbox.conftest import GROUP, record_batch, records
from tests.inbox.factories import Event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ordered")]

PENDING, DONE, FAILED, PARKED = "PENDING", "DONE", "FAILED", "PARKED"


@pytest.fixture
def ordered():
    with override_app_settings("INBOX", ORDERING="key", GROUP_ORDERING={}):
        yield


def effect_order() -> list[str]:
    """The event ids whose handler's effect committed, in the order they were applied."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT event_id FROM inbox_test_effect WHERE consumer_group = %s ORDER BY id",
            [GROUP],
        )
        return [event_id for (event_id,) in cursor.fetchall()]


def statuses(*events: Event) -> list[str]:
    rows = dict(InboxMessage.objects.values_list("event_id", "status"))
    return [rows.get(event.event_id, "absent") for event in events]


def row(event: Event) -> InboxMessage:
    return InboxMessage.objects.get(event_id=event.event_id)


def make_due(*events: Event) -> None:
    """What the backoff would do after a while: the PENDING heads become due now."""
    InboxMessage.objects.filter(event_id__in=[e.event_id for e in events], status=PENDING).update(
        next_attempt_at=timezone.now()
    )


def test_a_failed_message_parks_the_later_messages_of_its_key_and_other_keys_flow(applied):
    a1, a2, a3 = (Event(aggregate_id="a") for _ in range(3))
    b1 = Event(aggregate_id="b")
    applied["raise_for"] = {a1.event_id}
    result = record_batch(records([a1, a2, b1, a3]))
    assert (result.processed, result.failed, result.parked) == (1, 1, 2)
    assert statuses(a1, a2, b1, a3) == [PENDING, PARKED, DONE, PARKED]
    assert effect_order() == [b1.event_id]
    assert row(a2).attempts == 0

    # A later batch: the key is still held by a row of an earlier one.
    a4, b2 = Event(aggregate_id="a"), Event(aggregate_id="b")
    result = record_batch(records([a4, b2], start=4))
    assert statuses(a4, b2) == [PARKED, DONE]

    # Nothing is due yet: the head waits for its backoff, the parked rows for the head.
    assert inbox_messages_retry_due(limit=10) == {
        "done": 0,
        "pending": 0,
        "failed": 0,
        "skipped": 0,
    }
    applied["raise_for"] = set()
    make_due(a1)
    assert inbox_messages_retry_due(limit=10)["done"] == 4
    assert statuses(a1, a2, a3, a4) == [DONE] * 4
    assert effect_order() == [e.event_id for e in (b1, b2, a1, a2, a3, a4)]


def test_a_run_of_the_sequence_stops_at_the_next_failure(applied):
    a1, a2, a3 = (Event(aggregate_id="a") for _ in range(3))
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2, a3]))
    applied["raise_for"] = {a2.event_id}
    make_due(a1)
    assert inbox_messages_retry_due(limit=10) == {
        "done": 1,
        "pending": 1,
        "failed": 0,
        "skipped": 0,
    }
    assert statuses(a1, a2, a3) == [DONE, PENDING, PARKED]
    assert row(a2).attempts == 1
    assert row(a2).next_attempt_at > timezone.now()
    applied["raise_for"] = set()
    make_due(a2)
    inbox_messages_retry_due(limit=10)
    assert effect_order() == [a1.event_id, a2.event_id, a3.event_id]


@override_app_settings("INBOX", MAX_ATTEMPTS=1)
def test_a_failed_head_holds_its_key_until_an_operator_replays_it(applied):
    a1, a2 = Event(aggregate_id="a"), Event(aggregate_id="a")
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2]))
    assert statuses(a1, a2) == [FAILED, PARKED]
    assert inbox_messages_retry_due(limit=10)["done"] == 0
    applied["raise_for"] = set()
    inbox_message_replay(message=row(a1))
    assert inbox_messages_retry_due(limit=10)["done"] == 2
    assert effect_order() == [a1.event_id, a2.event_id]


@override_app_settings("INBOX", MAX_ATTEMPTS=1)
def test_skipping_the_head_discards_it_and_runs_the_rest(applied):
    a1, a2, a3 = (Event(aggregate_id="a") for _ in range(3))
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2, a3]))
    skipped = inbox_sequence_skip_head(group=GROUP, topic="t", key="a")
    assert skipped.event_id == a1.event_id
    assert skipped.discarded_at is not None
    assert inbox_messages_retry_due(limit=10)["done"] == 2
    assert statuses(a1, a2, a3) == [FAILED, DONE, DONE]
    assert effect_order() == [a2.event_id, a3.event_id]
    with pytest.raises(InvalidTransition, match="not held"):
        inbox_sequence_skip_head(group=GROUP, topic="t", key="a")


@override_app_settings("INBOX", MAX_ATTEMPTS=1)
def test_discarding_a_failed_head_is_skipping_it(applied):
    a1, a2 = Event(aggregate_id="a"), Event(aggregate_id="a")
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2]))
    inbox_message_discard(message=row(a1))
    inbox_messages_retry_due(limit=10)
    assert statuses(a1, a2) == [FAILED, DONE]


@override_app_settings("INBOX", MAX_ATTEMPTS=1)
def test_releasing_the_key_runs_the_rest_and_keeps_the_head_for_a_replay(applied):
    a1, a2, a3 = (Event(aggregate_id="a") for _ in range(3))
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2, a3]))
    released = inbox_sequence_release(group=GROUP, topic="t", key="a")
    assert released.released_at is not None
    inbox_messages_retry_due(limit=10)
    assert statuses(a1, a2, a3) == [FAILED, DONE, DONE]
    # The released head no longer holds the key: a new message of it runs at once.
    a4 = Event(aggregate_id="a")
    record_batch(records([a4], start=3))
    assert statuses(a4) == [DONE]
    # Replayed, it runs on its own, after the others.
    applied["raise_for"] = set()
    inbox_message_replay(message=row(a1))
    inbox_messages_retry_due(limit=10)
    assert effect_order() == [e.event_id for e in (a2, a3, a4, a1)]


@override_app_settings("INBOX", MAX_ATTEMPTS=1)
def test_an_operator_retry_of_the_sequence_makes_a_failed_head_due_with_a_fresh_budget(applied):
    a1, a2 = Event(aggregate_id="a"), Event(aggregate_id="a")
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2]))
    applied["raise_for"] = set()
    head = inbox_sequence_retry(group=GROUP, topic="t", key="a")
    assert (head.event_id, head.status, head.attempts) == (a1.event_id, PENDING, 0)
    assert inbox_messages_retry_due(limit=10)["done"] == 2
    assert effect_order() == [a1.event_id, a2.event_id]
    with pytest.raises(InvalidTransition, match="not held"):
        inbox_sequence_retry(group=GROUP, topic="t", key="a")


def test_redeliveries_of_parked_messages_are_counted_and_never_run_twice(applied):
    a1, a2 = Event(aggregate_id="a"), Event(aggregate_id="a")
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2]))
    for deduplicate in (True, False):
        result = record_batch(records([a1, a2]), deduplicate=deduplicate)
        assert (result.duplicates, result.processed, result.parked) == (2, 0, 0)
    assert statuses(a1, a2) == [PENDING, PARKED]
    assert row(a2).duplicate_count == 2
    applied["raise_for"] = set()
    make_due(a1)
    inbox_messages_retry_due(limit=10)
    record_batch(records([a1, a2]))
    assert effect_order() == [a1.event_id, a2.event_id]


def test_messages_left_to_the_retry_task_by_a_slow_batch_keep_their_order(applied):
    a1, a2, b1 = Event(aggregate_id="a"), Event(aggregate_id="a"), Event(aggregate_id="b")
    result = record_batch(records([a1, a2, b1]), deadline=time.monotonic() - 1)
    assert (result.deferred, result.parked) == (2, 1)
    assert statuses(a1, a2, b1) == [PENDING, PARKED, PENDING]
    assert inbox_messages_retry_due(limit=10)["done"] == 3
    assert effect_order().index(a1.event_id) < effect_order().index(a2.event_id)


def test_a_poison_record_does_not_hold_its_key(applied):
    a1 = Event(aggregate_id="a")
    poison = Message(
        topic="t", partition=0, offset=0, key=b"a", value=b"not json", headers=a1.headers()
    )
    a2 = Event(aggregate_id="a")
    record_batch([parse_record(poison), *records([a2], start=1)])
    assert statuses(a1, a2) == [FAILED, DONE]
    assert row(a1).released_at is not None


def test_messages_without_a_key_are_never_parked(applied):
    first, second = Event(), Event()
    keyless = [
        parse_record(
            Message(topic="t", partition=0, offset=i, key=None, value=e.value, headers=e.headers())
        )
        for i, e in enumerate((first, second))
    ]
    applied["raise_for"] = {first.event_id}
    record_batch(keyless)
    assert statuses(first, second) == [PENDING, DONE]
    applied["raise_for"] = set()
    make_due(first)
    assert inbox_messages_retry_due(limit=10)["done"] == 1


def test_ordering_none_runs_every_message_on_its_own(applied):
    a1, a2 = Event(aggregate_id="a"), Event(aggregate_id="a")
    applied["raise_for"] = {a1.event_id}
    with override_app_settings("INBOX", GROUP_ORDERING={GROUP: "none"}):
        record_batch(records([a1, a2]))
        assert statuses(a1, a2) == [PENDING, DONE]
        applied["raise_for"] = set()
        make_due(a1)
        inbox_messages_retry_due(limit=10)
    # The inversion that ordering "key" prevents.
    assert effect_order() == [a2.event_id, a1.event_id]


def test_an_operator_made_due_parked_row_still_waits_for_its_head(applied):
    a1, a2 = Event(aggregate_id="a"), Event(aggregate_id="a")
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2]))
    assert inbox_messages_retry(message_ids=[row(a2).pk]) == 0
    inbox_messages_retry_due(limit=10)
    assert statuses(a1, a2) == [PENDING, PARKED]


@pytest.mark.django_db(transaction=True)
def test_a_message_parked_behind_a_head_that_a_run_is_finishing_runs_on_the_next_pass(applied):
    """A run of the sequence finishes the head in another transaction while a batch, which
    still sees the head unfinished, parks a message behind it. The parked message is then
    first in its key and the retry task's next pass runs it: late, not stuck, in order."""
    a1, a2 = Event(aggregate_id="a"), Event(aggregate_id="a")
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1]))
    head = row(a1)
    try:
        with connect_outside_django(connection.settings_dict) as other:
            other.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                [sequence_lock_name(GROUP, "t", "a")],
            )
            other.execute("UPDATE inbox_message SET status = 'DONE' WHERE id = %s", [head.pk])
            # The batch runs while the run has not committed: it does not wait for it.
            result = record_batch(records([a2], start=1))
            other.commit()
        assert result.parked == 1
        assert statuses(a1, a2) == [DONE, PARKED]
        assert inbox_messages_retry_due(limit=10)["done"] == 1
        assert statuses(a2) == [DONE]
        assert effect_order() == [a2.event_id]
    finally:
        # Committed, and the flush after a transactional test empties Django's tables only.
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM inbox_test_effect WHERE consumer_group = %s", [GROUP])


@override_app_settings("INBOX", MAX_ATTEMPTS=1)
def test_a_replayed_skipped_head_holds_its_key_again(applied):
    a1, a2, a3 = (Event(aggregate_id="a") for _ in range(3))
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2]))
    inbox_sequence_skip_head(group=GROUP, topic="t", key="a")
    inbox_messages_retry_due(limit=10)
    applied["raise_for"] = set()
    inbox_message_replay(message=row(a1))
    record_batch(records([a3], start=2))
    assert statuses(a1, a2, a3) == [PENDING, DONE, PARKED]
    inbox_messages_retry_due(limit=10)
    assert effect_order() == [a2.event_id, a1.event_id, a3.event_id]


def test_an_exactly_once_group_stores_the_offsets_of_parked_messages(applied):
    a1, a2, b1 = Event(aggregate_id="a"), Event(aggregate_id="a"), Event(aggregate_id="b")
    applied["raise_for"] = {a1.event_id}
    record_batch(records([a1, a2, b1]), exactly_once=True, deduplicate=False)
    assert statuses(a1, a2, b1) == [PENDING, PARKED, DONE]
    assert ConsumerOffset.objects.get(consumer_group=GROUP).next_offset == 3
    # Delivered again below the stored offset: skipped, nothing runs or parks again.
    again = record_batch(records([a1, a2, b1]), exactly_once=True, deduplicate=False)
    assert (again.skipped, again.processed, again.parked) == (3, 0, 0)
    applied["raise_for"] = set()
    make_due(a1)
    inbox_messages_retry_due(limit=10)
    assert effect_order() == [b1.event_id, a1.event_id, a2.event_id]


def test_a_parked_handler_s_publication_commits_with_its_run(inbox_registry, effects):
    """Chaining: a parked message's handler publishes through the outbox when its sequence
    runs; the event commits with the row's DONE state, and a failed run publishes nothing."""
    import outbox
    from inbox import handler
    from outbox.models import OutboxEvent

    failing = {"first"}

    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def chain(message):
        outbox.publish(
            aggregate_type="delivery",
            aggregate_id=message.aggregate_id,
            event_type="DeliveryStarted",
            payload={"after": message.event_id},
        )
        if message.payload.get("name") in failing:
            raise ValueError("not yet")

    first = Event(aggregate_id="a", payload={"name": "first"})
    second = Event(aggregate_id="a", payload={"name": "second"})
    record_batch(records([first, second]))
    assert statuses(first, second) == [PENDING, PARKED]
    assert not OutboxEvent.objects.exists()  # the failed handler's publication rolled back
    failing.clear()
    make_due(first)
    inbox_messages_retry_due(limit=10)
    published = list(
        OutboxEvent.objects.order_by("transaction_id", "position").values_list("payload", flat=True)
    )
    assert published == [{"after": first.event_id}, {"after": second.event_id}]
