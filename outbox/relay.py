"""The relay: claim a batch of due events, publish them with the idempotent producer, and
mark each by its delivery report. No database transaction or row lock is held while
talking to Kafka: the claim is a lease, committed before the first record is produced."""

import logging
import os
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message
from django.conf import settings
from django.db import transaction

from outbox import metrics
from outbox.producer import (
    RelayProducer,
    discard_producer,
    get_producer,
    record_size,
    topic_record_limits,
)
from outbox.services.claims import (
    ClaimedEvent,
    Delivery,
    DeliveryFailure,
    outbox_events_claim,
    outbox_events_mark_failed,
    outbox_events_mark_published,
    outbox_events_release,
)

logger = logging.getLogger(__name__)

CONTENT_TYPE = b"application/json"
# How long to wait for free space in librdkafka's queue before trying to produce again.
QUEUE_FULL_POLL_SECONDS = 0.05
# Fault-injection tests name a point here to have the relay SIGKILL itself there. Inert
# unless the variable is set, which only the tests and the scenario runner do.
FAULT_INJECTION_VARIABLE = "OUTBOX_FAULT_INJECTION"


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_INJECTION_VARIABLE) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class OutgoingEvent(Protocol):
    """What a relay sends of an event: a claimed one, or one read from the event log."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def aggregate_type(self) -> str: ...
    @property
    def aggregate_id(self) -> str: ...
    @property
    def event_type(self) -> str: ...
    @property
    def payload_json(self) -> str: ...
    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def topic(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...


def record_headers(event: OutgoingEvent) -> list[tuple[str, str | bytes | None]]:
    headers: list[tuple[str, str | bytes | None]] = [
        ("event_id", str(event.id).encode()),
        ("event_type", event.event_type.encode()),
        ("aggregate_type", event.aggregate_type.encode()),
        ("aggregate_id", event.aggregate_id.encode()),
        ("created_at", event.created_at.astimezone(UTC).isoformat().encode()),
        ("content-type", CONTENT_TYPE),
    ]
    headers.extend((name, value.encode()) for name, value in event.headers.items())
    return headers


def default_relay_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def transactional_id_for(slot: str) -> str | None:
    if not settings.OUTBOX_RELAY_TRANSACTIONAL:
        return None
    return f"{settings.OUTBOX_TRANSACTIONAL_ID_PREFIX}-{slot}"


@dataclass
class BatchResult:
    claimed: int = 0
    published: int = 0
    failed: int = 0
    released: int = 0
    # Produced but not reported within the delivery timeout: left leased, never re-sent early.
    unreported: int = 0
    # run() ended on an empty claim, not at its deadline: nothing was due when it stopped.
    drained: bool = False


@dataclass
class DeliveryReports:
    deliveries: dict[uuid.UUID, Delivery] = field(default_factory=dict)
    failures: dict[uuid.UUID, str] = field(default_factory=dict)
    # Refused by the producer itself (too large, say): no broker was asked, none would take it.
    refused: set[uuid.UUID] = field(default_factory=set)
    # Not produced: an earlier event of the same key was refused.
    skipped: set[uuid.UUID] = field(default_factory=set)

    def refuse(self, event: OutgoingEvent, error: str) -> None:
        self.failures[event.id] = error
        self.refused.add(event.id)

    def on_delivery(self, event_id: uuid.UUID, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.deliveries[event_id] = Delivery(
                event_id=event_id,
                partition=message.partition() or 0,
                offset=message.offset() or 0,
                published_at=datetime.now(UTC),
            )
        else:
            self.failures[event_id] = f"{error.name()}: {error.str()}"


def produce_all(
    producer: RelayProducer, events: Sequence[OutgoingEvent], reports: DeliveryReports
) -> bool:
    """Produces every event in the given order; returns False on a fatal producer error.

    An event refused before any broker sees it is a failure: one over its topic's
    max.message.bytes (a broker would refuse it every time), or one the producer itself
    refuses (over message.max.bytes, say). The later events of its key are not produced at
    all (reports.skipped): they would overtake it."""
    kafka = producer.producer
    limits = topic_record_limits({event.topic for event in events})
    refused_keys: set[tuple[str, str]] = set()
    for event in events:
        if (event.topic, event.key) in refused_keys:
            reports.skipped.add(event.id)
            continue
        key, value, headers = event.key.encode(), event.payload_json.encode(), record_headers(event)
        limit = limits.get(event.topic)
        if (
            limit is not None
            and (size := record_size(key=key, value=value, headers=headers)) > limit
        ):
            reports.refuse(
                event,
                f"RECORD_TOO_LARGE: the record takes up to {size} bytes; topic {event.topic} "
                f"takes at most {limit} (max.message.bytes)",
            )
            refused_keys.add((event.topic, event.key))
            continue
        while True:
            try:
                kafka.produce(
                    event.topic,
                    key=key,
                    value=value,
                    headers=headers,
                    on_delivery=partial(reports.on_delivery, event.id),
                )
                break
            except BufferError:
                kafka.poll(QUEUE_FULL_POLL_SECONDS)
            except KafkaException as error:
                kafka_error: KafkaError = error.args[0]
                if kafka_error.fatal():
                    producer.fatal_error = kafka_error
                    return False
                reports.refuse(event, f"{kafka_error.name()}: {kafka_error.str()}")
                refused_keys.add((event.topic, event.key))
                break
        kafka.poll(0)
    return producer.fatal_error is None


def publish_batch(
    producer: RelayProducer, events: Sequence[OutgoingEvent], *, timeout: float
) -> tuple[DeliveryReports, bool]:
    """Produces the events and waits up to `timeout` seconds for their delivery reports;
    returns the reports and whether the producer hit a fatal error."""
    reports = DeliveryReports()
    produce_all(producer, events, reports)
    producer.producer.flush(timeout)
    return reports, producer.fatal_error is not None


def publish_batch_in_transaction(
    producer: RelayProducer, events: Sequence[OutgoingEvent], *, timeout: float
) -> tuple[DeliveryReports, bool]:
    """The same in one Kafka transaction: every record is delivered, or none (an aborted
    transaction fails them all)."""
    reports = DeliveryReports()
    kafka = producer.producer
    try:
        kafka.begin_transaction()
        if not produce_all(producer, events, reports):
            return DeliveryReports(), True
        kafka.commit_transaction(timeout)
        kafka.flush(0)
    except KafkaException as error:
        kafka_error = error.args[0]
        if kafka_error.fatal():
            # Fenced by a newer relay with the same transactional.id, or worse.
            producer.fatal_error = kafka_error
            return DeliveryReports(), True
        logger.warning("Outbox relay aborts its Kafka transaction: %s", kafka_error)
        try:
            kafka.abort_transaction(timeout)
        except KafkaException as abort_error:
            if abort_error.args[0].fatal():
                producer.fatal_error = abort_error.args[0]
                return DeliveryReports(), True
        reason = f"transaction aborted: {kafka_error.name()}: {kafka_error.str()}"
        return DeliveryReports(failures={event.id: reason for event in events}), False
    # Records become visible to read_committed consumers at the commit, not at delivery.
    committed_at = datetime.now(UTC)
    for event_id, delivery in list(reports.deliveries.items()):
        reports.deliveries[event_id] = Delivery(
            event_id=event_id,
            partition=delivery.partition,
            offset=delivery.offset,
            published_at=committed_at,
        )
    return reports, False


class Relay:
    """Publishes due outbox events. Any number of relays may run at once."""

    def __init__(
        self,
        *,
        relay_id: str | None = None,
        transactional_id: str | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.relay_id = relay_id or default_relay_id()
        self.transactional_id = transactional_id
        self.batch_size = batch_size or settings.OUTBOX_BATCH_SIZE
        self.delivery_timeout = settings.OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS / 1000

    def run(self, *, max_seconds: float | None = None) -> BatchResult:
        """Publishes batches while there are due events, for at most max_seconds.

        A batch holds one event per (topic, key) (the next in its order), so a batch that is
        not full may still leave due events behind: the loop ends on an empty batch."""
        deadline = time.monotonic() + (max_seconds or settings.OUTBOX_RELAY_MAX_RUN_SECONDS)
        total = BatchResult()
        while True:
            result = self.run_once()
            for name in ("claimed", "published", "failed", "released", "unreported"):
                setattr(total, name, getattr(total, name) + getattr(result, name))
            if not result.claimed:
                total.drained = True
                return total
            if time.monotonic() >= deadline:
                return total

    def run_once(self) -> BatchResult:
        events = outbox_events_claim(relay_id=self.relay_id, batch_size=self.batch_size)
        if not events:
            return BatchResult()
        try:
            producer = get_producer(transactional_id=self.transactional_id)
        except KafkaException as error:
            logger.warning("Outbox relay cannot create its producer: %s", error)
            released = outbox_events_release(
                relay_id=self.relay_id, event_ids=[e.id for e in events]
            )
            return BatchResult(claimed=len(events), released=released)
        if self.transactional_id:
            reports, fatal = self._publish_in_transaction(producer, events)
        else:
            reports, fatal = self._publish(producer, events)
        fault_point("before-mark")
        result = self._mark(events, reports, fatal)
        if fatal:
            logger.error(
                "Outbox relay replaces its producer after a fatal error: %s", producer.fatal_error
            )
            discard_producer(producer)
        return result

    def _publish(
        self, producer: RelayProducer, events: list[ClaimedEvent]
    ) -> tuple[DeliveryReports, bool]:
        return publish_batch(producer, events, timeout=self.delivery_timeout + 5)

    def _publish_in_transaction(
        self, producer: RelayProducer, events: list[ClaimedEvent]
    ) -> tuple[DeliveryReports, bool]:
        return publish_batch_in_transaction(producer, events, timeout=self.delivery_timeout + 5)

    def _mark(
        self, events: list[ClaimedEvent], reports: DeliveryReports, fatal: bool
    ) -> BatchResult:
        by_id = {event.id: event for event in events}
        deliveries = list(reports.deliveries.values())
        failures = [
            DeliveryFailure(event_id=event_id, error=error)
            for event_id, error in reports.failures.items()
            if event_id not in reports.deliveries
        ]
        result = BatchResult(claimed=len(events))
        reported = set(reports.deliveries) | set(reports.failures)
        unreported = [event.id for event in events if event.id not in reported]
        with transaction.atomic():
            result.published = outbox_events_mark_published(deliveries=deliveries)
            if fatal:
                # The producer is rebuilt; what it did not confirm stays PENDING, unpenalised.
                result.released = outbox_events_release(
                    relay_id=self.relay_id,
                    event_ids=[f.event_id for f in failures] + unreported,
                )
            else:
                result.failed = outbox_events_mark_failed(relay_id=self.relay_id, failures=failures)
                result.unreported = len(unreported)
        self._observe(by_id, deliveries, failures if not fatal else [])
        if result.unreported:
            logger.warning(
                "Outbox relay: %d events got no delivery report within %.0fs; their lease "
                "keeps other relays off them until it expires",
                result.unreported,
                self.delivery_timeout,
            )
        return result

    @staticmethod
    def _observe(
        by_id: dict[uuid.UUID, ClaimedEvent],
        deliveries: list[Delivery],
        failures: list[DeliveryFailure],
    ) -> None:
        for topic, count in Counter(by_id[d.event_id].topic for d in deliveries).items():
            metrics.PUBLISHED.labels(topic=topic).inc(count)
        for delivery in deliveries:
            lag = (delivery.published_at - by_id[delivery.event_id].created_at).total_seconds()
            metrics.PUBLISH_LAG.observe(max(lag, 0.0))
        for failure in failures:
            event = by_id[failure.event_id]
            if event.attempts + 1 >= settings.OUTBOX_MAX_ATTEMPTS:
                metrics.FAILED.labels(topic=event.topic).inc()
            else:
                metrics.RETRIED.labels(topic=event.topic).inc()
