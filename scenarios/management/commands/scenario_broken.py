"""Deliberately broken variants of the consumer and the relay, for the scenarios that show
the delivery checker can fail. The breakage lives here, in the scenarios app (never installed
in production), and is active only with SCENARIO_BROKEN=1; otherwise the real command runs.

A fault that a variant needs to show its breakage (an event refused once) is set apart, by its
own variable: with it and without SCENARIO_BROKEN, the real relay must pass."""

import json
import os
import signal
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from inbox.consumer import InboxConsumer
from inbox.services.recording import BatchResult
from outbox import log_relay
from outbox.log_relay import LogRelay, LogRunResult, SentBatch
from outbox.models import OutboxDelivery
from outbox.producer import RelayProducer, get_producer
from outbox.relay import DeliveryReports, produce_all
from outbox.services.event_log.deliveries import DeliveryRecord
from outbox.services.event_log.spans import LogEvent
from outbox.tracing import SendSpans
from scenarios.conf import REFUSED_EVENT_VARIABLE

BROKEN_VARIABLE = "SCENARIO_BROKEN"


def break_consumer() -> None:
    """Offsets committed before the database transaction: a crash inside the transaction
    loses the batch (inbox/faults.py's before_db_commit point kills it there)."""
    correct = InboxConsumer._record_and_commit

    def broken(self: InboxConsumer, messages: Any) -> BatchResult:
        self._commit_offsets(messages)
        return correct(self, messages)

    InboxConsumer._record_and_commit = broken  # type: ignore[method-assign]


def break_log_relay() -> None:
    """The relay records its batch as published (its events DONE) and moves its cursor when
    the records are handed to the producer, before any delivery report; it then dies before
    its flush, and the queued records die with it."""

    def broken_send(self: LogRelay, events: Sequence[LogEvent]) -> SentBatch:
        producer = get_producer()
        produce_all(producer, events, DeliveryReports(events))
        now = datetime.now(UTC)
        delivered = [
            DeliveryRecord(
                event_id=event.id,
                outcome=OutboxDelivery.Outcome.PUBLISHED,
                published_at=now,
                partition=0,
                offset=-1,
            )
            for event in events
        ]
        return SentBatch(delivered=delivered, failed=[], fatal=False)

    correct_record = log_relay.batch_record

    def record_then_die(**arguments: Any) -> None:
        correct_record(**arguments)
        os.kill(os.getpid(), signal.SIGKILL)

    LogRelay._send = broken_send  # type: ignore[method-assign]
    log_relay.batch_record = record_then_die


def break_log_relay_order() -> None:
    """The relay sends each batch in reverse commit order: of two events of one key in a
    batch, the later reaches Kafka first. Nothing is lost and nothing sent twice."""
    correct_send = LogRelay._send

    def reversed_send(self: LogRelay, events: Sequence[LogEvent]) -> SentBatch:
        return correct_send(self, list(reversed(events)))

    LogRelay._send = reversed_send  # type: ignore[method-assign]


def break_log_relay_txid_order() -> None:
    """The relay sends each batch in transaction-id order, then position (the order in which
    it reads a span): of two events of a key committed between the same two ticks, the one
    whose transaction took its id first goes first, though it took the aggregate's lock, and
    its position, last. Nothing is lost and nothing sent twice."""
    correct_send = LogRelay._send

    def txid_order_send(self: LogRelay, events: Sequence[LogEvent]) -> SentBatch:
        return correct_send(self, sorted(events, key=lambda event: (event.txid, event.position)))

    LogRelay._send = txid_order_send  # type: ignore[method-assign]


def break_log_relay_retries() -> None:
    """The relay never tries a held key's head again: a key held after a failure stays held,
    and its events wait for good, though the next try would go through."""

    def no_retry(self: LogRelay, result: LogRunResult) -> bool:
        return False

    LogRelay._retry_held = no_retry  # type: ignore[method-assign]


def refuse_event_once(number: int) -> None:
    """The producer refuses the event numbered `number` the first time this process sends it,
    as produce_all refuses a record no broker would take: a failure, and the later events of
    its key in the batch not produced (skipped). Sent again, it goes through."""
    correct_publish = log_relay.publish_batch
    refused: set[uuid.UUID] = set()

    def publish(
        producer: RelayProducer,
        events: Sequence[LogEvent],
        *,
        timeout: float,
        spans: SendSpans | None = None,
    ) -> tuple[DeliveryReports, bool]:
        target = next(
            (
                event
                for event in events
                if event.id not in refused and json.loads(event.payload_json).get("n") == number
            ),
            None,
        )
        if target is None:
            return correct_publish(producer, events, timeout=timeout, spans=spans)
        behind = {
            event.id
            for event in events[events.index(target) + 1 :]
            if (event.topic, event.key) == (target.topic, target.key)
        }
        sent = [event for event in events if event is not target and event.id not in behind]
        reports, fatal = correct_publish(producer, sent, timeout=timeout, spans=spans)
        reports.refuse(target, "REFUSED: refused once by the scenario's producer")
        reports.skipped.update(behind)
        refused.add(target.id)
        return reports, fatal

    log_relay.publish_batch = publish


class Command(BaseCommand):
    help = "Runs inbox_consume or outbox_relay, broken on purpose when SCENARIO_BROKEN=1."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "variant",
            choices=[
                "consumer-commit-first",
                "log-relay-cursor-first",
                "log-relay-reversed",
                "log-relay-txid-order",
                "log-relay-no-retry",
            ],
        )
        parser.add_argument("--group")
        parser.add_argument("--slot", default="broken")

    def handle(self, *args: Any, **options: Any) -> None:
        active = os.environ.get(BROKEN_VARIABLE) == "1"
        if options["variant"] == "consumer-commit-first":
            if active:
                break_consumer()
            call_command("inbox_consume", group=options["group"])
            return
        refused = os.environ.get(REFUSED_EVENT_VARIABLE)
        if refused:
            refuse_event_once(int(refused))
        if active:
            breakages = {
                "log-relay-cursor-first": break_log_relay,
                "log-relay-reversed": break_log_relay_order,
                "log-relay-txid-order": break_log_relay_txid_order,
                "log-relay-no-retry": break_log_relay_retries,
            }
            breakages[options["variant"]]()
        call_command("outbox_relay", slot=options["slot"], poll_seconds=0.2)
