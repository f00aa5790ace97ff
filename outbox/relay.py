"""Sending events to Kafka with the idempotent producer, and collecting their delivery
reports: the part of the relay (outbox.log_relay) that talks to Kafka. No database
transaction is open while it does."""

import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

from confluent_kafka import KafkaError, KafkaException, Message

from outbox.conf import outbox_settings
from outbox.producer import (
    RelayProducer,
    record_size,
    topic_record_limits,
)
from outbox.services.event_log.spans import LogEvent
from outbox.tracing import SendSpans

logger = logging.getLogger(__name__)

CONTENT_TYPE = b"application/json"
# How long to wait for free space in librdkafka's queue before trying to produce again.
QUEUE_FULL_POLL_SECONDS = 0.05
# What a broker (or librdkafka, for the cluster) answers for a record that no retry will
# deliver as long as the topic stays as it is: the topic does not exist (on a cluster that
# creates none on demand, librdkafka gives up on it after topic.metadata.propagation.max.ms),
# this principal may not write it, or the record is one the topic refuses. Such a failure holds
# its key, as a refusal before producing does, and the other keys go on; it is not an outage.
PERMANENT_RECORD_ERRORS = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.POLICY_VIOLATION,
    }
)
# Refusals of a record for its topic as a whole: the topic's metadata is read again before
# the next record to it (RelayProducer.refresh_refused_topics).
TOPIC_REFUSALS = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)
# Fault-injection tests name a point here to have the relay SIGKILL itself there. Inert
# unless the variable is set, which only the tests and the scenario runner do.
FAULT_INJECTION_VARIABLE = "OUTBOX_FAULT_INJECTION"


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_INJECTION_VARIABLE) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def record_headers(event: LogEvent) -> list[tuple[str, str | bytes | None]]:
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
    if not outbox_settings.RELAY_TRANSACTIONAL:
        return None
    return f"{outbox_settings.TRANSACTIONAL_ID_PREFIX}-{slot}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """The broker's confirmation of one record."""

    event_id: uuid.UUID
    partition: int
    offset: int
    published_at: datetime


@dataclass
class DeliveryReports:
    deliveries: dict[uuid.UUID, Delivery] = field(default_factory=dict)
    failures: dict[uuid.UUID, str] = field(default_factory=dict)
    # Refused for good: by the producer itself (too large, say), or by the answer of the
    # cluster (PERMANENT_RECORD_ERRORS). Not an outage: no retry of the batch would help.
    refused: set[uuid.UUID] = field(default_factory=set)
    # Not produced: an earlier event of the same key was refused.
    skipped: set[uuid.UUID] = field(default_factory=set)
    # When each record was handed to the producer (time.monotonic(), seconds), and how long
    # the try of each took until its delivery report or refusal, in whole milliseconds. A
    # clock read and a dict entry per record at each end: nothing heavier on the hot path.
    handed_at: dict[uuid.UUID, float] = field(default_factory=dict)
    durations_ms: dict[uuid.UUID, int] = field(default_factory=dict)
    # Topics that refused a record as a topic (TOPIC_REFUSALS).
    refused_topics: set[str] = field(default_factory=set)

    def refuse(self, event: LogEvent, error: str) -> None:
        self.failures[event.id] = error
        self.refused.add(event.id)
        self._took(event.id)

    def duration_ms(self, event_id: uuid.UUID) -> int | None:
        """How long the try of `event_id` took: until its report or refusal, or for one with
        neither, until now (when the relay gives up on it); None if it was never handed to
        the producer."""
        took = self.durations_ms.get(event_id)
        if took is None and event_id in self.handed_at:
            took = round((time.monotonic() - self.handed_at[event_id]) * 1000)
        return took

    def _took(self, event_id: uuid.UUID) -> None:
        handed_at = self.handed_at.get(event_id)
        if handed_at is not None:
            self.durations_ms[event_id] = round((time.monotonic() - handed_at) * 1000)

    def on_delivery(self, event_id: uuid.UUID, error: KafkaError | None, message: Message) -> None:
        self._took(event_id)
        if error is None:
            self.deliveries[event_id] = Delivery(
                event_id=event_id,
                partition=message.partition() or 0,
                offset=message.offset() or 0,
                published_at=datetime.now(UTC),
            )
        else:
            self.failures[event_id] = f"{error.name()}: {error.str()}"
            if error.code() in PERMANENT_RECORD_ERRORS:
                self.refused.add(event_id)
            if error.code() in TOPIC_REFUSALS:
                self.refused_topics.add(message.topic() or "")


def produce_all(
    producer: RelayProducer,
    events: Sequence[LogEvent],
    reports: DeliveryReports,
    spans: SendSpans | None = None,
) -> bool:
    """Produces every event in the given order; returns False on a fatal producer error.
    With `spans` (tracing on), each event's send span starts before it is produced; the
    caller ends them.

    An event refused before any broker sees it is a failure: one over its topic's
    max.message.bytes (a broker would refuse it every time), or one the producer itself
    refuses (over message.max.bytes, say). The later events of its key are not produced at
    all (reports.skipped): they would overtake it."""
    kafka = producer.producer
    topics = {event.topic for event in events}
    producer.refresh_refused_topics(topics)
    limits = topic_record_limits(topics)
    refused_keys: set[tuple[str, str]] = set()
    for event in events:
        if (event.topic, event.key) in refused_keys:
            reports.skipped.add(event.id)
            continue
        reports.handed_at[event.id] = time.monotonic()
        if spans is not None:
            spans.start(event)
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
                if kafka_error.code() in TOPIC_REFUSALS:
                    reports.refused_topics.add(event.topic)
                break
        kafka.poll(0)
    return producer.fatal_error is None


def publish_batch(
    producer: RelayProducer,
    events: Sequence[LogEvent],
    *,
    timeout: float,
    spans: SendSpans | None = None,
) -> tuple[DeliveryReports, bool]:
    """Produces the events and waits up to `timeout` seconds for their delivery reports;
    returns the reports and whether the producer hit a fatal error."""
    reports = DeliveryReports()
    produce_all(producer, events, reports, spans)
    producer.producer.flush(timeout)
    producer.refused_topics |= reports.refused_topics
    return reports, producer.fatal_error is not None


def publish_batch_in_transaction(
    producer: RelayProducer,
    events: Sequence[LogEvent],
    *,
    timeout: float,
    spans: SendSpans | None = None,
) -> tuple[DeliveryReports, bool]:
    """The same in one Kafka transaction: every record is delivered, or none (an aborted
    transaction fails them all)."""
    reports = DeliveryReports()
    try:
        return _publish_in_transaction(producer, events, reports, timeout=timeout, spans=spans)
    finally:
        producer.refused_topics |= reports.refused_topics


def _publish_in_transaction(
    producer: RelayProducer,
    events: Sequence[LogEvent],
    reports: DeliveryReports,
    *,
    timeout: float,
    spans: SendSpans | None,
) -> tuple[DeliveryReports, bool]:
    kafka = producer.producer
    try:
        kafka.begin_transaction()
        if not produce_all(producer, events, reports, spans):
            return DeliveryReports(handed_at=reports.handed_at), True
        kafka.commit_transaction(timeout)
        kafka.flush(0)
    except KafkaException as error:
        kafka_error = error.args[0]
        if kafka_error.fatal():
            # Fenced by a newer relay with the same transactional.id, or worse.
            producer.fatal_error = kafka_error
            return DeliveryReports(handed_at=reports.handed_at), True
        logger.warning("Outbox relay aborts its Kafka transaction: %s", kafka_error)
        try:
            kafka.abort_transaction(timeout)
        except KafkaException as abort_error:
            # Not aborted: after a commit that timed out librdkafka may still be committing,
            # and every later begin_transaction() of this producer would fail. It is replaced
            # (get_producer() builds another for a producer with an error); the new one's
            # init_transactions() finishes or aborts what this one left, and the batch is
            # sent again, at least once.
            logger.warning(
                "Outbox relay replaces its producer, whose abort failed: %s", abort_error
            )
            producer.fatal_error = abort_error.args[0]
            return DeliveryReports(handed_at=reports.handed_at), True
        reason = f"transaction aborted: {kafka_error.name()}: {kafka_error.str()}"
        # Every try lasted until the abort, reported or not.
        aborted = DeliveryReports(
            failures={event.id: reason for event in events}, handed_at=reports.handed_at
        )
        return aborted, False
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
