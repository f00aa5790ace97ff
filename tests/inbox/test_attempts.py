"""Attempt history (inbox.models.InboxAttempt, inbox/services/attempts.py): written by the
consumer's batches and by the retry task, in the transaction of each run's outcome."""

import datetime as dt
import os
import socket
import uuid

import pytest
from django.db import transaction
from django.utils import timezone

from inbox import handler
from inbox.models import InboxAttempt, InboxMessage
from inbox.services.attempts import inbox_attempts_insert
from inbox.services.retention import inbox_messages_purge_processed
from inbox.services.retries import inbox_message_retry, inbox_messages_retry_due
from inbox.services.sequences import inbox_sequence_run
from tests.app_settings import override_app_settings
from tests.inbox.conftest import GROUP, consume_until, record_batch, records
from tests.inbox.factories import Event, produce

PROCESS = f"{socket.gethostname()}:{os.getpid()}"
RETRY_MEMBER = f"retry-task@{PROCESS}"


class PaymentGatewayDown(Exception):
    pass


def attempts_of(message: InboxMessage) -> list[InboxAttempt]:
    return list(InboxAttempt.objects.filter(message_id=message.pk).order_by("id"))


def due_now(message: InboxMessage) -> None:
    InboxMessage.objects.filter(pk=message.pk).update(next_attempt_at=timezone.now())


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_a_message_failing_twice_then_succeeding_has_three_attempts_in_order(
    kafka_topic, inbox_registry, run_consumer
):
    topic, group = kafka_topic(), f"test-attempts-{uuid.uuid4().hex[:10]}"
    runs = {"count": 0}

    @handler(event_type="OrderPlaced", topic=topic, group=group)
    def charge(message: InboxMessage) -> None:
        if (message.payload or {}).get("flaky"):
            runs["count"] += 1
            if runs["count"] <= 2:
                raise PaymentGatewayDown(f"gateway timed out (run {runs['count']})")

    produce(topic, [Event(payload={"flaky": False}), Event(payload={"flaky": True})])
    consumer = run_consumer(group=group)
    consume_until(consumer, lambda: InboxMessage.objects.filter(consumer_group=group).count() == 2)
    member_id = consumer.consumer.memberid()
    flaky = InboxMessage.objects.get(consumer_group=group, offset=1)
    steady = InboxMessage.objects.get(consumer_group=group, offset=0)
    assert flaky.status == InboxMessage.Status.PENDING

    # The retry task runs it twice more: a failure, then the success.
    for expected in (InboxMessage.Status.PENDING, InboxMessage.Status.DONE):
        due_now(flaky)
        assert inbox_message_retry(message_id=flaky.pk).status == expected

    attempts = attempts_of(flaky)
    assert [a.outcome for a in attempts] == ["FAILED", "FAILED", "DONE"]
    assert [a.error_class for a in attempts] == [
        f"{__name__}.PaymentGatewayDown",
        f"{__name__}.PaymentGatewayDown",
        "",
    ]
    assert "gateway timed out (run 1)" in attempts[0].error
    assert attempts[0].error.startswith(f"{__name__}.PaymentGatewayDown: gateway timed out")
    assert "gateway timed out (run 2)" in attempts[1].error
    assert attempts[2].error == ""
    # The first run was the consumer's, on the record it read; the others the retry task's,
    # on the stored copy of that record.
    assert member_id
    assert attempts[0].member == f"{member_id}@{PROCESS}"
    assert [a.member for a in attempts[1:]] == [RETRY_MEMBER, RETRY_MEMBER]
    assert [(a.partition, a.offset) for a in attempts] == [(0, 1)] * 3
    assert {a.handler for a in attempts} == {f"{__name__}.{charge.__qualname__}"}
    assert attempts[0].attempted_at < attempts[1].attempted_at < attempts[2].attempted_at
    assert all(a.duration_ms >= 0 for a in attempts)
    flaky.refresh_from_db()
    assert flaky.attempts == 3
    assert flaky.processed_at is not None
    assert attempts[2].attempted_at <= flaky.processed_at

    # The steady message ran once; a redelivery of both is a duplicate: no handler runs, no
    # attempt is written, only the duplicate is counted.
    assert [a.outcome for a in attempts_of(steady)] == ["DONE"]
    produce(topic, [Event(event_id=flaky.event_id, payload={"flaky": True})])
    consume_until(
        consumer,
        lambda: InboxMessage.objects.filter(pk=flaky.pk, duplicate_count=1).exists(),
    )
    assert len(attempts_of(flaky)) == 3
    assert InboxAttempt.objects.count() == 4


@pytest.mark.django_db
def test_the_attempts_roll_back_with_the_batch(applied):
    bad = Event()
    applied["raise_for"] = {bad.event_id}

    class Crash(Exception):
        pass

    # The batch's transaction does not commit (a crash before the commit): neither its rows
    # nor their attempts stay.
    with pytest.raises(Crash), transaction.atomic():
        record_batch(records([Event(), bad]))
        assert InboxAttempt.objects.count() == 2
        raise Crash
    assert not InboxMessage.objects.exists()
    assert not InboxAttempt.objects.exists()

    record_batch(records([Event(), bad]))
    row = InboxMessage.objects.get(event_id=bad.event_id)
    due_now(row)
    with pytest.raises(Crash), transaction.atomic():
        inbox_message_retry(message_id=row.pk)
        assert len(attempts_of(row)) == 2
        raise Crash
    assert len(attempts_of(row)) == 1


@pytest.mark.django_db
def test_one_statement_writes_the_attempts_of_a_batch(applied, monkeypatch):
    calls: list[int] = []

    def counted(*, attempts, member):
        calls.append(len(attempts))
        inbox_attempts_insert(attempts=attempts, member=member)

    monkeypatch.setattr("inbox.services.recording.inbox_attempts_insert", counted)
    bad = Event()
    applied["raise_for"] = {bad.event_id}
    record_batch(records([*(Event() for _ in range(49)), bad]))
    assert calls == [50]
    assert InboxAttempt.objects.filter(outcome="DONE").count() == 49
    assert InboxAttempt.objects.filter(outcome="FAILED").count() == 1
    # Without a member named, the group's client.id at this process.
    assert set(InboxAttempt.objects.values_list("member", flat=True)) == {
        f"inbox-{GROUP}@{PROCESS}"
    }


@pytest.mark.django_db
def test_a_redelivery_runs_again_with_deduplication_off_and_is_an_attempt(applied):
    event = Event()
    with override_app_settings("INBOX", DEDUPLICATE=False):
        record_batch(records([event]))
        record_batch(records([event], start=7))
    row = InboxMessage.objects.get()
    # The second delivery ran the handler again (what exactly-once mode alone makes safe).
    assert [(a.outcome, a.offset) for a in attempts_of(row)] == [("DONE", 0), ("DONE", 7)]


@pytest.mark.django_db
def test_an_unknown_event_type_and_a_duplicate_in_the_batch_have_no_attempts(applied):
    event = Event()
    with override_app_settings("INBOX", UNKNOWN_EVENT_TYPE="fail"):
        record_batch(records([Event(event_type="Unknown"), event, event]))
    unknown = InboxMessage.objects.get(event_type="Unknown")
    assert unknown.status == InboxMessage.Status.FAILED
    assert attempts_of(unknown) == []
    assert [a.outcome for a in attempts_of(InboxMessage.objects.get(event_id=event.event_id))] == [
        "DONE"
    ]


@pytest.mark.django_db
def test_a_retry_without_a_handler_is_a_failed_attempt(applied):
    with override_app_settings("INBOX", UNKNOWN_EVENT_TYPE="fail"):
        record_batch(records([Event(event_type="Gone")]))
    row = InboxMessage.objects.get()
    InboxMessage.objects.filter(pk=row.pk).update(status="PENDING", next_attempt_at=timezone.now())
    inbox_message_retry(message_id=row.pk)
    [attempt] = attempts_of(row)
    assert (attempt.outcome, attempt.error_class, attempt.handler, attempt.member) == (
        "FAILED",
        "inbox.errors.NoHandlerForRetry",
        "",
        RETRY_MEMBER,
    )


@pytest.mark.django_db
def test_a_sequence_run_writes_an_attempt_per_message_it_runs(inbox_registry):
    failing = {"on": True}

    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def apply(message: InboxMessage) -> None:
        if failing["on"] and message.offset == 0:
            raise PaymentGatewayDown("down")

    key = "order-7"
    events = [Event(aggregate_id=key) for _ in range(3)]
    with override_app_settings("INBOX", ORDERING="key"):
        record_batch(records(events))
        head = InboxMessage.objects.get(offset=0)
        assert set(InboxMessage.objects.values_list("status", flat=True)) == {"PENDING", "PARKED"}
        failing["on"] = False
        due_now(head)
        run = inbox_sequence_run(group=GROUP, topic="t", key=key)
    assert run.done == 3
    by_offset = {
        row.offset: [(a.outcome, a.member) for a in attempts_of(row)]
        for row in InboxMessage.objects.all()
    }
    consumer = f"inbox-{GROUP}@{PROCESS}"
    assert by_offset == {
        0: [("FAILED", consumer), ("DONE", RETRY_MEMBER)],
        # Parked by the consumer without a run: their only attempt is the retry task's.
        1: [("DONE", RETRY_MEMBER)],
        2: [("DONE", RETRY_MEMBER)],
    }


@pytest.mark.django_db
def test_the_retry_task_writes_the_attempts_of_what_it_runs(applied):
    bad = Event()
    applied["raise_for"] = {bad.event_id}
    record_batch(records([bad]))
    row = InboxMessage.objects.get()
    due_now(row)
    applied["raise_for"] = set()
    assert inbox_messages_retry_due(limit=10)["done"] == 1
    assert [(a.outcome, a.member) for a in attempts_of(row)] == [
        ("FAILED", f"inbox-{GROUP}@{PROCESS}"),
        ("DONE", RETRY_MEMBER),
    ]


@pytest.mark.django_db
def test_the_retention_deletes_the_attempts_with_their_messages(applied):
    bad = Event()
    applied["raise_for"] = {bad.event_id}
    record_batch(records([Event(), Event(), bad]))
    InboxMessage.objects.filter(status="DONE").update(
        processed_at=timezone.now() - dt.timedelta(days=30)
    )
    InboxMessage.objects.filter(event_id=bad.event_id).update(
        status="FAILED", received_at=timezone.now() - dt.timedelta(days=30)
    )
    assert InboxAttempt.objects.count() == 3
    assert inbox_messages_purge_processed(batch_size=1, max_batches=10) == 2
    # The FAILED message stays for an operator, with its history.
    kept = InboxMessage.objects.get()
    assert kept.event_id == bad.event_id
    assert list(InboxAttempt.objects.values_list("message_id", flat=True)) == [kept.pk]
