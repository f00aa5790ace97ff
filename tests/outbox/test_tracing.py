"""outbox/tracing.py: the caller's trace context, and the spans of publish() and the relay."""

import io
import json
import logging
import re
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import transaction
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils import timezone
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    use_span,
)

import outbox
from kafka_events.tracing import TraceContextFilter, active_tracer, use_tracer_provider
from outbox.errors import DuplicateEvent
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.services.event_log.spans import LogEvent
from outbox.tracing import SendSpans, TraceContextMiddleware, caller_traceparent
from tests.conftest import publish_numbered
from tests.outbox.conftest import wait_until

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# The caller's span, as a request's traceparent makes it.
REMOTE = SpanContext(
    trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
    span_id=0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
)


@pytest.mark.parametrize(
    ("header", "seen"),
    [(TRACEPARENT, TRACEPARENT), ("garbage", None), ("", None)],
)
def test_the_middleware_sets_a_valid_traceparent_for_the_request_only(header, seen):
    observed = []

    def view(request):
        observed.append(caller_traceparent())
        return HttpResponse()

    request = RequestFactory().get("/", headers={"traceparent": header} if header else {})
    TraceContextMiddleware(view)(request)
    assert observed == [seen]
    assert caller_traceparent() is None


# Spans of publish() and the relay, recorded by the SDK's in-memory exporter -----------------


@contextmanager
def recording_spans() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider for the block, its spans kept in memory (OpenTelemetry's
    global provider can be set once per process: kafka_events.tracing swaps it instead)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(None)
        provider.shutdown()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recording_spans() as exporter:
        yield exporter


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def traceparent_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"


def publish_one(topic: str, key: str = "order-1", **options) -> OutboxEvent:
    with transaction.atomic():
        return outbox.publish(
            aggregate_type="order",
            aggregate_id=key,
            event_type="OrderPlaced",
            payload={"n": 1},
            topic=topic,
            **options,
        )


@pytest.mark.django_db
def test_without_an_sdk_publish_makes_no_span_and_keeps_the_callers_traceparent():
    assert active_tracer() is None
    with use_span(NonRecordingSpan(REMOTE)):
        event = publish_one("orders")
    assert event.headers["traceparent"] == TRACEPARENT
    assert OutboxEvent.objects.get(id=event.id).headers["traceparent"] == TRACEPARENT


@pytest.mark.django_db
def test_publish_makes_a_create_span_in_the_callers_trace_and_stores_its_context(spans):
    with use_span(NonRecordingSpan(REMOTE)):
        event = publish_one("orders", key="order-9")
    [create] = spans.get_finished_spans()
    assert create.name == "create orders"
    assert create.kind is SpanKind.PRODUCER
    assert create.parent is not None
    assert (create.parent.trace_id, create.parent.span_id) == (REMOTE.trace_id, REMOTE.span_id)
    assert dict(create.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.destination.name": "orders",
        "messaging.message.id": str(event.id),
        "messaging.kafka.message.key": "order-9",
    }
    # The creation context the relay and the consumers continue is the span's, stored.
    stored = OutboxEvent.objects.get(id=event.id).headers
    assert stored["traceparent"] == traceparent_of(create)


@pytest.mark.django_db
def test_a_callers_own_traceparent_header_is_kept_and_no_create_span_is_made(spans):
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with use_span(NonRecordingSpan(REMOTE)):
        event = publish_one("orders", headers={"traceparent": own})
    assert event.headers["traceparent"] == own
    assert spans.get_finished_spans() == ()


@pytest.mark.django_db
def test_a_publish_that_fails_records_the_error_on_its_span(spans):
    event_id = uuid.uuid4()
    publish_one("orders", event_id=event_id)
    spans.clear()
    with pytest.raises(DuplicateEvent):
        publish_one("orders", event_id=event_id)
    [create] = spans.get_finished_spans()
    assert create.status.status_code is StatusCode.ERROR
    assert [e.name for e in create.events] == ["exception"]


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_relay_sends_each_event_in_a_span_of_its_creation_context(
    spans, kafka_topic, log_relay
):
    topic = kafka_topic()
    with use_span(NonRecordingSpan(REMOTE)):
        first = publish_one(topic, key="a")
        second = publish_one(topic, key="b")
    assert log_relay().run().published == 2
    creates = {
        span.attributes["messaging.message.id"]: span for span in named(spans, f"create {topic}")
    }
    sends = {
        span.attributes["messaging.message.id"]: span for span in named(spans, f"send {topic}")
    }
    assert set(sends) == {str(first.id), str(second.id)}
    delivered = {str(d.event_id): d for d in OutboxDelivery.objects.filter(outcome="PUBLISHED")}
    for event_id, send in sends.items():
        create = creates[event_id]
        assert send.kind is SpanKind.PRODUCER
        assert send.context.trace_id == REMOTE.trace_id
        assert send.parent is not None
        assert send.parent.span_id == create.context.span_id
        assert send.status.status_code is StatusCode.UNSET
        attributes = dict(send.attributes or {})
        assert attributes == {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": topic,
            "messaging.message.id": event_id,
            "messaging.kafka.message.key": create.attributes["messaging.kafka.message.key"],
            "messaging.destination.partition.id": str(delivered[event_id].kafka_partition),
            "messaging.kafka.offset": delivered[event_id].kafka_offset,
            "outbox.attempt": 1,
            "outbox.outcome": "published",
        }
    assert sorted(s.attributes["messaging.kafka.offset"] for s in sends.values()) == [0, 1]


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_a_refused_event_is_held_retried_and_failed_on_its_send_spans(
    spans, kafka_topic, size_limited_log_relay
):
    # OUTBOX_MAX_ATTEMPTS=2: the first try holds the key, the retry spends the attempts.
    topic = kafka_topic()
    with use_span(NonRecordingSpan(REMOTE)):
        head = publish_numbered(topic, "a", 0, too_large=True)
        behind = publish_numbered(topic, "a", 1)
    size_limited_log_relay.run()
    OutboxHeldEvent.objects.filter(event_id=head.id).update(next_attempt_at=timezone.now())
    size_limited_log_relay.run()
    assert OutboxHeldEvent.objects.get(event_id=head.id).next_attempt_at is None  # FAILED

    tries = [
        s
        for s in named(spans, f"send {topic}")
        if s.attributes["messaging.message.id"] == str(head.id)
    ]
    assert [(s.attributes["outbox.attempt"], s.attributes["outbox.outcome"]) for s in tries] == [
        (1, "held"),
        (2, "failed"),
    ]
    for span in tries:
        assert span.context.trace_id == REMOTE.trace_id
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "MSG_SIZE_TOO_LARGE"
        [exception] = span.events
        assert exception.name == "exception"
        assert exception.attributes["exception.type"] == "MSG_SIZE_TOO_LARGE"
    # The event behind the head was never sent: no span of its own.
    assert not [
        s
        for s in named(spans, f"send {topic}")
        if s.attributes["messaging.message.id"] == str(behind.id)
    ]


def test_the_relays_log_lines_carry_the_trace_and_span_ids_of_the_event():
    event = LogEvent(
        id=uuid.uuid4(),
        aggregate_type="order",
        aggregate_id="a",
        event_type="E",
        payload_json="{}",
        headers_json=json.dumps({"traceparent": TRACEPARENT}),
        topic="t",
        key="a",
        created_at=timezone.now(),
        txid=1,
        position=1,
        shard=0,
    )
    with recording_spans() as exporter:
        tracer = active_tracer()
        assert tracer is not None
        send = SendSpans(tracer, attempts={}, attempt=1)
        send.start(event)
        send.finish_unfinished("MSG_TIMED_OUT: Local: Message timed out")
        with send.current(event.id):
            line = log_line(logging.getLogger("outbox.log_relay"), "a line about the event")
    [span] = exporter.get_finished_spans()
    assert line.endswith(
        f"a line about the event trace_id={REMOTE.trace_id:032x}"
        f" span_id={span.context.span_id:016x}"
    )
    assert log_line(logging.getLogger("outbox.log_relay"), "outside").endswith(" outside")


def log_line(logger: logging.Logger, text: str) -> str:
    """`text` logged through the console handler that settings.LOGGING configures, as it
    would be written."""
    [console] = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler)
        and any(isinstance(f, TraceContextFilter) for f in h.filters)
    ]
    stream = io.StringIO()
    previous = console.setStream(stream)
    try:
        logger.warning(text)
    finally:
        console.setStream(previous)
    return stream.getvalue().rstrip("\n")


def printed_spans(output: str) -> list[dict]:
    """The spans the console exporter printed (indented JSON objects) among other lines."""
    return [json.loads(text) for text in re.findall(r"^\{\n.*?^\}$", output, re.M | re.S)]


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_relay_command_exports_send_spans_when_an_exporter_is_asked_for(
    kafka_topic, start_relay
):
    topic = kafka_topic()
    with use_span(NonRecordingSpan(REMOTE)):
        event = publish_one(topic)
    relay = start_relay(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="relay-under-test")
    wait_until(
        lambda: OutboxDelivery.objects.filter(event_id=event.id).exists(),
        timeout=30,
        message="the delivery",
    )
    relay.send_signal(signal.SIGTERM)
    output, _ = relay.communicate(timeout=40)
    assert relay.returncode == 0, output
    [send] = [span for span in printed_spans(output) if span["name"] == f"send {topic}"]
    assert send["kind"] == "SpanKind.PRODUCER"
    assert send["context"]["trace_id"] == f"0x{REMOTE.trace_id:032x}"
    assert send["parent_id"] == f"0x{REMOTE.span_id:016x}"
    assert send["attributes"]["outbox.outcome"] == "published"
    assert send["resource"]["attributes"]["service.name"] == "relay-under-test"
