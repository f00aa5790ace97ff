"""Sending events to Kafka with the idempotent producer, and collecting their delivery
reports: the part of the relay (outbox.log_relay) that talks to Kafka. No database
transaction is open while it does."""

import json
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
from outbox.models import OutboxDelivery
from outbox.producer import RelayProducer, topic_record_limits
from outbox.services.event_log.deliveries import DeliveryRecord, record_time
from outbox.services.event_log.spans import NO_HEADERS, LogEvent
from outbox.tracing import SendSpans

logger = logging.getLogger(__name__)

CONTENT_TYPE = b"application/json"
PUBLISHED_OUTCOME = OutboxDelivery.Outcome.PUBLISHED
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


# A record batch holding one record adds this much to its key, value and headers at most:
# the batch header (61 bytes) and the record's own lengths and offsets (varints).
RECORD_OVERHEAD_BYTES = 100
HEADER_OVERHEAD_BYTES = 10
# What the six headers every event carries take besides their own values.
_FIXED_HEADER_BYTES = (
    sum(
        len(name) + HEADER_OVERHEAD_BYTES
        for name in ("event_id", "event_type", "aggregate_type", "aggregate_id", "created_at")
    )
    + len("content-type")
    + HEADER_OVERHEAD_BYTES
    + len(CONTENT_TYPE)
)


def record_headers(event: LogEvent) -> list[tuple[str, str | bytes | None]]:
    return _record(event)[2]


def _record(event: LogEvent) -> tuple[bytes, bytes, list[tuple[str, str | bytes | None]], int]:
    """The record of an event: its key, value and headers, and the uncompressed size of the
    record in a batch of its own, as an upper bound. Each piece is encoded once and measured
    as it is: no pass over the headers again."""
    key, value = event.key.encode(), event.payload_json.encode()
    event_id = (event.id_text or str(event.id)).encode()
    event_type, aggregate_type = event.event_type.encode(), event.aggregate_type.encode()
    aggregate_id = event.aggregate_id.encode()
    created_at = (event.created_at_text or event.created_at.astimezone(UTC).isoformat()).encode()
    headers: list[tuple[str, str | bytes | None]] = [
        ("event_id", event_id),
        ("event_type", event_type),
        ("aggregate_type", aggregate_type),
        ("aggregate_id", aggregate_id),
        ("created_at", created_at),
        ("content-type", CONTENT_TYPE),
    ]
    size = (
        RECORD_OVERHEAD_BYTES
        + _FIXED_HEADER_BYTES
        + len(key)
        + len(value)
        + len(event_id)
        + len(event_type)
        + len(aggregate_type)
        + len(aggregate_id)
        + len(created_at)
    )
    if event.headers_json == NO_HEADERS:
        return key, value, headers, size
    for name, header in json.loads(event.headers_json).items():
        encoded = header.encode()
        headers.append((name, encoded))
        size += len(name.encode()) + len(encoded) + HEADER_OVERHEAD_BYTES
    return key, value, headers, size


def default_relay_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def transactional_id_for(slot: str) -> str | None:
    if not outbox_settings.RELAY_TRANSACTIONAL:
        return None
    return f"{outbox_settings.TRANSACTIONAL_ID_PREFIX}-{slot}"


# A delivery report as the callback stores it: the error (None when delivered), the message
# and when it came (time.monotonic()).
Report = tuple[KafkaError | None, Message, float]


@dataclass
class DeliveryReports:
    """What became of each record of a batch of `events`: its delivery report, or its failure
    before any broker saw it.

    Per event, the hot path does only what no batch can do for it: the producer's callback
    stores its report by the event's index, and settle() reads them all in one pass after the
    flush."""

    events: Sequence[LogEvent] = ()
    # By the index of each event in `events`: when it was handed to the producer
    # (time.monotonic(); None: never), and its report.
    handed_at: list[float | None] = field(default_factory=list)
    reported: list[Report | None] = field(default_factory=list)
    # Made by settle(): a record of each event the broker confirmed, in the order produced;
    # how many of them each topic got, and the publish lag of each, in seconds.
    delivered: list[DeliveryRecord] = field(default_factory=list)
    published_per_topic: dict[str, int] = field(default_factory=dict)
    lag_seconds: list[float] = field(default_factory=list)
    failures: dict[uuid.UUID, str] = field(default_factory=dict)
    # Refused for good: by the producer itself (too large, say), or by the answer of the
    # cluster (PERMANENT_RECORD_ERRORS). Not an outage: no retry of the batch would help.
    refused: set[uuid.UUID] = field(default_factory=set)
    # Not produced: an earlier event of the same key was refused.
    skipped: set[uuid.UUID] = field(default_factory=set)
    # How long the try of each failed event took until its report or refusal, in whole
    # milliseconds.
    durations_ms: dict[uuid.UUID, int] = field(default_factory=dict)
    # Topics that refused a record as a topic (TOPIC_REFUSALS).
    refused_topics: set[str] = field(default_factory=set)
    _handed_at_by_id: dict[uuid.UUID, float | None] | None = field(
        default=None, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self.handed_at = self.handed_at or [None] * len(self.events)
        self.reported = [None] * len(self.events)

    def on_delivery(self, index: int, error: KafkaError | None, message: Message) -> None:
        self.reported[index] = (error, message, time.monotonic())

    def refuse(self, event: LogEvent, error: str, *, handed_at: float | None = None) -> None:
        self.failures[event.id] = error
        self.refused.add(event.id)
        if handed_at is not None:
            self.durations_ms[event.id] = round((time.monotonic() - handed_at) * 1000)

    def settle(self, *, committed_at: datetime | None = None) -> None:
        """Reads the reports the callback stored. A delivered record was published when its
        report came; in a Kafka transaction (`committed_at`), at the commit, when
        read_committed consumers see it."""
        wall_clock_offset = time.time() - time.monotonic()
        published_per_topic, lag_seconds = self.published_per_topic, self.lag_seconds
        for event, handed_at, report in zip(
            self.events, self.handed_at, self.reported, strict=True
        ):
            if report is None or handed_at is None:
                continue
            error, message, reported_at = report
            took_ms = round((reported_at - handed_at) * 1000)
            if error is not None:
                self._failed(event, error, message, took_ms)
                continue
            published_at = record_time(
                event,
                committed_at or datetime.fromtimestamp(wall_clock_offset + reported_at, UTC),
            )
            self.delivered.append(
                DeliveryRecord(
                    event.id,
                    PUBLISHED_OUTCOME,
                    published_at,
                    message.partition() or 0,
                    message.offset() or 0,
                    "",
                    took_ms,
                )
            )
            published_per_topic[event.topic] = published_per_topic.get(event.topic, 0) + 1
            lag_seconds.append((published_at - event.created_at).total_seconds())

    def _failed(self, event: LogEvent, error: KafkaError, message: Message, took_ms: int) -> None:
        self.failures[event.id] = f"{error.name()}: {error.str()}"
        self.durations_ms[event.id] = took_ms
        if error.code() in PERMANENT_RECORD_ERRORS:
            self.refused.add(event.id)
        if error.code() in TOPIC_REFUSALS:
            self.refused_topics.add(message.topic() or "")

    def failure_duration_ms(self, event: LogEvent) -> int | None:
        """How long the failed try of `event` took: until its report or refusal, or for one
        with neither, until now (when the relay gives up on it); None if it was never handed
        to the producer."""
        took = self.durations_ms.get(event.id)
        if took is None:
            if self._handed_at_by_id is None:
                # Once per batch with failures, not a search of the batch per failed event.
                self._handed_at_by_id = {
                    sent.id: handed
                    for sent, handed in zip(self.events, self.handed_at, strict=True)
                }
            handed_at = self._handed_at_by_id.get(event.id)
            if handed_at is not None:
                took = round((time.monotonic() - handed_at) * 1000)
        return took


def produce_all(
    producer: RelayProducer,
    events: Sequence[LogEvent],
    reports: DeliveryReports,
    spans: SendSpans | None = None,
) -> bool:
    """Produces every event in the given order (`reports` is for the same events); returns
    False on a fatal producer error. With `spans` (tracing on), each event's send span starts
    before it is produced; the caller ends them.

    An event refused before any broker sees it is a failure: one over its topic's
    max.message.bytes (a broker would refuse it every time), or one the producer itself
    refuses (over message.max.bytes, say). The later events of its key are not produced at
    all (reports.skipped): they would overtake it.

    The delivery reports are served by the caller's flush: polling after each record would
    cost a call per event for reports nobody reads before then."""
    kafka = producer.producer
    produce, on_delivery, handed_at = kafka.produce, reports.on_delivery, reports.handed_at
    topics = {event.topic for event in events}
    producer.refresh_refused_topics(topics)
    limits = topic_record_limits(topics)
    refused_keys: set[tuple[str, str]] = set()
    for index, event in enumerate(events):
        if refused_keys and (event.topic, event.key) in refused_keys:
            reports.skipped.add(event.id)
            continue
        handed_at[index] = handed = time.monotonic()
        if spans is not None:
            spans.start(event)
        key, value, headers, size = _record(event)
        limit = limits.get(event.topic)
        if limit is not None and size > limit:
            reports.refuse(
                event,
                f"RECORD_TOO_LARGE: the record takes up to {size} bytes; topic {event.topic} "
                f"takes at most {limit} (max.message.bytes)",
                handed_at=handed,
            )
            refused_keys.add((event.topic, event.key))
            continue
        while True:
            try:
                produce(
                    event.topic,
                    value,
                    key,
                    headers=headers,
                    on_delivery=partial(on_delivery, index),
                )
                break
            except BufferError:
                kafka.poll(QUEUE_FULL_POLL_SECONDS)
            except KafkaException as error:
                kafka_error: KafkaError = error.args[0]
                if kafka_error.fatal():
                    producer.fatal_error = kafka_error
                    return False
                reports.refuse(
                    event, f"{kafka_error.name()}: {kafka_error.str()}", handed_at=handed
                )
                refused_keys.add((event.topic, event.key))
                if kafka_error.code() in TOPIC_REFUSALS:
                    reports.refused_topics.add(event.topic)
                break
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
    reports = DeliveryReports(events)
    produce_all(producer, events, reports, spans)
    producer.producer.flush(timeout)
    reports.settle()
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
    reports = DeliveryReports(events)
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
            return DeliveryReports(events, handed_at=reports.handed_at), True
        kafka.commit_transaction(timeout)
        kafka.flush(0)
    except KafkaException as error:
        kafka_error = error.args[0]
        if kafka_error.fatal():
            # Fenced by a newer relay with the same transactional.id, or worse.
            producer.fatal_error = kafka_error
            return DeliveryReports(events, handed_at=reports.handed_at), True
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
            return DeliveryReports(events, handed_at=reports.handed_at), True
        reason = f"transaction aborted: {kafka_error.name()}: {kafka_error.str()}"
        # Every try lasted until the abort, reported or not.
        aborted = DeliveryReports(
            events, failures={event.id: reason for event in events}, handed_at=reports.handed_at
        )
        return aborted, False
    reports.settle(committed_at=datetime.now(UTC))
    return reports, False
