"""Trace context and spans of the outbox (docs/tracing.md), after OpenTelemetry's messaging
semantic conventions:

- publish() makes a `create` span (kind PRODUCER) in the caller's context, inside the business
  transaction, and stores its context with the event (the W3C `traceparent` and `tracestate`
  headers): the event's creation context, which every record of the event carries;
- the relay makes a `send` span (kind PRODUCER) per event and try, a child of that creation
  context, ended when the try's outcome is known: published (partition, offset), retrying,
  held behind its key, or failed for good.

With no SDK configured (kafka_events.tracing.active_tracer() is None) no span is made; publish()
still stores the caller's traceparent, so a consumer's work can join the request's trace.
"""

import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from kafka_events.tracing import (
    MESSAGING_SYSTEM,
    W3C,
    active_tracer,
    context_from_headers,
    sampling_attributes,
)

if TYPE_CHECKING:
    from outbox.services.event_log.deliveries import DeliveryRecord
    from outbox.services.event_log.spans import LogEvent

TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
# version-traceid-parentid-flags, https://www.w3.org/TR/trace-context/#traceparent-header
TRACEPARENT_PATTERN = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

# A caller's traceparent set by hand (a worker that got it some other way); the active
# OpenTelemetry span, when there is one, comes first.
current_traceparent: ContextVar[str | None] = ContextVar("current_traceparent", default=None)


class Outcome:
    """What became of an event's try, the `outbox.outcome` of its send span."""

    PUBLISHED = "published"
    # Nothing of the batch reached Kafka (an outage): the same batch is sent again.
    RETRYING = "retrying"
    # Failed, and holds its key (or waits behind its key's failed head) until retried.
    HELD = "held"
    # Its attempts are spent: FAILED, waiting for an operator.
    FAILED = "failed"


def caller_context() -> Context:
    """The context the caller's events belong to: the active span's, else the traceparent
    set in `current_traceparent`, else the current (empty) context."""
    current = otel_context.get_current()
    if trace.get_current_span(current).get_span_context().is_valid:
        return current
    traceparent = current_traceparent.get()
    if traceparent:
        return W3C.extract({TRACEPARENT_HEADER: traceparent})
    return current


def caller_traceparent() -> str | None:
    """The traceparent of the caller's context (see caller_context), or None."""
    carrier: dict[str, str] = {}
    W3C.inject(carrier, context=caller_context())
    return carrier.get(TRACEPARENT_HEADER)


class TraceContextMiddleware:
    """Makes an incoming request's valid W3C `traceparent` (and `tracestate`) the context of
    the request, so the events it publishes belong to the caller's trace. A request that
    already has a span (OpenTelemetry's Django instrumentation) keeps it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if trace.get_current_span().get_span_context().is_valid:
            return self.get_response(request)
        traceparent = request.headers.get(TRACEPARENT_HEADER, "").strip().lower()
        if not TRACEPARENT_PATTERN.match(traceparent):
            return self.get_response(request)
        carrier = {TRACEPARENT_HEADER: traceparent}
        tracestate = request.headers.get(TRACESTATE_HEADER)
        if tracestate:
            carrier[TRACESTATE_HEADER] = tracestate
        token = otel_context.attach(W3C.extract(carrier))
        try:
            return self.get_response(request)
        finally:
            otel_context.detach(token)


@contextmanager
def publish_span(
    *, topic: str, key: str, event_id: uuid.UUID, headers: dict[str, str]
) -> Iterator[None]:
    """Around the insert of an event: writes the event's creation context into `headers`.

    Headers that already hold a traceparent are the caller's own creation context: left as
    they are, and no span is made (the messaging conventions say so). Otherwise, with an SDK,
    a `create` span in the caller's context, whose context is stored; without one, the
    caller's traceparent as it is."""
    if TRACEPARENT_HEADER in headers:
        yield
        return
    tracer = active_tracer()
    if tracer is None:
        W3C.inject(headers, context=caller_context())
        yield
        return
    with tracer.start_as_current_span(
        f"create {topic}",
        context=caller_context(),
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "create",
            "messaging.operation.name": "create",
            "messaging.destination.name": topic,
            "messaging.message.id": str(event_id),
            "messaging.kafka.message.key": key,
        },
    ):
        W3C.inject(headers)
        yield


# The kind of error a failure's text starts with, as the relay writes it ("MSG_TIMED_OUT: ...").
ERROR_CODE = re.compile(r"^([A-Z_][A-Z0-9_]*):")


def _nanoseconds(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


class SendSpans:
    """The relay's send spans of one batch: the time each event is produced is noted, and its
    span is made, whole, once the relay knows what became of it. Made only when a tracer is
    active (see send_spans).

    A span made whole at the end, with its start time given, costs a third less than one
    started before the produce and completed after (no attribute set one by one, each under
    a lock, and no open span per event kept through the batch's flush)."""

    def __init__(
        self, tracer: trace.Tracer, *, attempts: Mapping[uuid.UUID, int], attempt: int
    ) -> None:
        self.tracer = tracer
        self.attempts = attempts
        self.attempt = attempt
        # The events produced and not yet ended, with the time they were produced (ns).
        self.started: dict[uuid.UUID, tuple[LogEvent, int]] = {}
        # The span context of each event ended, for log lines about it.
        self.ended: dict[uuid.UUID, trace.SpanContext] = {}

    def start(self, event: "LogEvent") -> None:
        self.started[event.id] = (event, time.time_ns())

    def finish(self, record: "DeliveryRecord", outcome: str) -> None:
        """Makes and ends the span of `record`'s event (if it was produced) with its outcome."""
        if outcome == Outcome.PUBLISHED:
            self._end(
                record.event_id,
                outcome,
                partition=record.partition,
                offset=record.offset,
                end_time=_nanoseconds(record.published_at),
            )
        else:
            self._end(record.event_id, outcome, error=record.error)

    def finish_unfinished(self, error: str) -> None:
        """Ends what is left open when the batch stopped short (an exception)."""
        for event_id in list(self.started):
            self._end(event_id, Outcome.RETRYING, error=error)

    def _end(
        self,
        event_id: uuid.UUID,
        outcome: str,
        *,
        partition: int | None = None,
        offset: int | None = None,
        end_time: int | None = None,
        error: str = "",
    ) -> None:
        begun = self.started.pop(event_id, None)
        if begun is None:
            return
        event, start_time = begun
        span = self.tracer.start_span(
            f"send {event.topic}",
            context=context_from_headers(event.headers),
            kind=SpanKind.PRODUCER,
            attributes=sampling_attributes("send", event.topic),
            start_time=start_time,
        )
        self.ended[event_id] = span.get_span_context()
        if not span.is_recording():
            # Sampled out (most often: its trace was, at its root): nothing more to build.
            return
        attributes: dict[str, Any] = {
            "messaging.message.id": str(event_id),
            "messaging.kafka.message.key": event.key,
            "outbox.attempt": self.attempts.get(event_id, self.attempt),
            "outbox.outcome": outcome,
        }
        if outcome == Outcome.PUBLISHED:
            attributes["messaging.destination.partition.id"] = str(partition)
            attributes["messaging.kafka.offset"] = offset or 0
            span.set_attributes(attributes)
            span.end(end_time=max(start_time, end_time or 0))
            return
        attributes["error.type"] = _error_type(error)
        span.set_attributes(attributes)
        span.add_event(
            "exception",
            {"exception.type": attributes["error.type"], "exception.message": error},
        )
        span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    @contextmanager
    def current(self, event_id: uuid.UUID) -> Iterator[None]:
        """Makes the ended span of the event the current context, for a log line about it."""
        context = self.ended.get(event_id)
        if context is None:
            yield
            return
        with trace.use_span(trace.NonRecordingSpan(context), end_on_exit=False):
            yield


def _error_type(error: str) -> str:
    match = ERROR_CODE.match(error)
    return match.group(1) if match else "_OTHER"


def send_spans(attempt: int | Mapping[uuid.UUID, int]) -> SendSpans | None:
    """Send spans for a batch whose events are tried for the `attempt`-th time (or as the
    mapping says, by event id), or None when no tracer is active."""
    tracer = active_tracer()
    if tracer is None:
        return None
    if isinstance(attempt, int):
        return SendSpans(tracer, attempts={}, attempt=attempt)
    return SendSpans(tracer, attempts=attempt, attempt=1)
