"""Spans of the consumers (docs/tracing.md), after OpenTelemetry's messaging semantic
conventions: a `process` span (kind CONSUMER) per record a group records, a child of the
event's creation context (the record's W3C `traceparent` header, which the outbox stored when
the event was published). The handler runs inside it, so what the handler publishes in turn
belongs to the same trace. A handler run again by the retry task gets a new span of its own,
linked to that creation context.

Made only when kafka_events.tracing.active_tracer() gives a tracer (an SDK is configured): the
consumer asks once per batch.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from inbox.records import InboxRecord
from kafka_events.tracing import context_from_headers, sampling_attributes

if TYPE_CHECKING:
    from inbox.models import InboxMessage


class Outcome:
    """What became of a record, the `inbox.outcome` of its process span."""

    PROCESSED = "processed"
    FAILED = "failed"
    # Recorded already by the group: counted, not run again.
    DUPLICATE = "duplicate"
    # Waits behind an earlier row of its key (order per key).
    PARKED = "parked"
    # Left for the retry task: the batch ran out of time.
    DEFERRED = "deferred"
    # No handler can ever run it (unreadable, or no handler for its type).
    POISON = "poison"


def _sampling_attributes(*, group: str, topic: str) -> dict[str, Any]:
    return {**sampling_attributes("process", topic), "messaging.consumer.group.name": group}


def _record_attributes(
    *, partition: int, offset: int, key: str | None, event_id: str
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.destination.partition.id": str(partition),
        "messaging.kafka.offset": offset,
        "messaging.message.id": event_id,
    }
    if key is not None:
        attributes["messaging.kafka.message.key"] = key
    return attributes


def process_span(
    tracer: trace.Tracer, *, group: str, record: InboxRecord, duplicate: bool
) -> trace.Span:
    """The span of one record of a batch, not yet current: the caller makes it current
    around the handler (trace.use_span) and ends it with end_span(). Attributes beyond those
    a sampler may decide on are added only to a recorded span."""
    span = tracer.start_span(
        f"process {record.topic}",
        context=context_from_headers(record.headers),
        kind=SpanKind.CONSUMER,
        attributes=_sampling_attributes(group=group, topic=record.topic),
    )
    if span.is_recording():
        attributes = _record_attributes(
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            event_id=record.event_id,
        )
        attributes["inbox.duplicate"] = duplicate
        span.set_attributes(attributes)
    return span


def retry_span(tracer: trace.Tracer, *, message: "InboxMessage") -> trace.Span:
    """The span of a handler run again from a stored row: in the current context (the
    retry task's), linked to the event's creation context, long past by now."""
    attributes = {
        **_sampling_attributes(group=message.consumer_group, topic=message.topic),
        **_record_attributes(
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            event_id=message.event_id,
        ),
    }
    attributes["inbox.retry"] = True
    attributes["inbox.attempt"] = message.attempts + 1
    stored = context_from_headers(message.headers or {})
    links = [] if stored is None else [Link(trace.get_current_span(stored).get_span_context())]
    return tracer.start_span(
        f"process {message.topic}", kind=SpanKind.CONSUMER, attributes=attributes, links=links
    )


def end_span(span: trace.Span, *, outcome: str, error: BaseException | str | None = None) -> None:
    span.set_attribute("inbox.outcome", outcome)
    if isinstance(error, BaseException):
        span.record_exception(error)
        span.set_attribute("error.type", f"{type(error).__module__}.{type(error).__qualname__}")
        span.set_status(Status(StatusCode.ERROR, str(error)))
    elif error:
        span.set_attribute("error.type", error.split(":", 1)[0])
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


@dataclass
class SpanEnd:
    """What the body run in a span (see `running_in`) says became of it."""

    outcome: str = Outcome.FAILED
    error: BaseException | str | None = None


@contextmanager
def running_in(span: trace.Span) -> Iterator[SpanEnd]:
    """Makes `span` current while the body runs, then ends it with the outcome and error the
    body set on the SpanEnd it is given. An exception that escapes the body (the batch stops
    there) ends the span as failed with that exception, recorded once."""
    end = SpanEnd()
    try:
        with trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            yield end
    except BaseException as raised:
        end.outcome, end.error = Outcome.FAILED, raised
        raise
    finally:
        end_span(span, outcome=end.outcome, error=end.error)
