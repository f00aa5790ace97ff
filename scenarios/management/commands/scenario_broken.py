"""Deliberately broken variants of the consumer and the relay, for the scenarios that show
the delivery checker can fail. The breakage lives here, in the scenarios app (never installed
in production), and is active only with SCENARIO_BROKEN=1; otherwise the real command runs."""

import os
import signal
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from inbox.consumer import InboxConsumer
from inbox.services.recording import BatchResult
from outbox import log_relay
from outbox.log_relay import LogRelay, SentBatch
from outbox.models import OutboxDelivery
from outbox.producer import get_producer
from outbox.relay import DeliveryReports, produce_all
from outbox.services.event_log import DeliveryRecord, LogEvent

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
        produce_all(producer, events, DeliveryReports())
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


class Command(BaseCommand):
    help = "Runs inbox_consume or outbox_relay, broken on purpose when SCENARIO_BROKEN=1."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "variant",
            choices=["consumer-commit-first", "log-relay-cursor-first"],
        )
        parser.add_argument("--group")
        parser.add_argument("--slot", default="broken")

    def handle(self, *args: Any, **options: Any) -> None:
        active = os.environ.get(BROKEN_VARIABLE) == "1"
        if options["variant"] == "consumer-commit-first":
            if active:
                break_consumer()
            call_command("inbox_consume", group=options["group"])
        else:
            if active:
                break_log_relay()
            call_command("outbox_relay", slot=options["slot"], poll_seconds=0.2)
