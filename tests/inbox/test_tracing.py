"""inbox/tracing.py: a consumer's process span per record, in the trace of the request that
published the event, and the whole chain request -> publish -> relay -> Kafka -> consumer ->
handler -> publish -> relay -> consumer as one trace."""

import logging
import uuid

import pytest
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from django.utils import timezone
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from inbox import handler
from inbox.models import InboxMessage
from inbox.services.retries import inbox_messages_retry_due
from kafka_events.tracing import active_tracer
from outbox import publish
from outbox.log_relay import LogRelay
from outbox.models import OutboxEvent
from tests.inbox.conftest import consume_until
from tests.inbox.factories import Event, produce
from tests.inbox.test_consumer import unique_group
from tests.outbox.test_tracing import (
    REMOTE,
    TRACEPARENT,
    log_line,
    named,
    recording_spans,
    traceparent_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def pay(request: HttpRequest, order: str) -> HttpResponse:
    """A view that publishes, as business code does."""
    with transaction.atomic():
        publish(
            aggregate_type="payment",
            aggregate_id=order,
            event_type="PaymentCompleted",
            payload={"order": order},
            topic=request.GET["topic"],
        )
    return HttpResponse(status=201)


# This module is the URLconf of the tests that send a request (pytest.mark.urls).
urlpatterns = [path("pay/<str:order>", pay)]


@pytest.fixture
def spans():
    with recording_spans() as exporter:
        yield exporter


def relay_all() -> int:
    relay = LogRelay()
    try:
        return relay.run().published
    finally:
        relay.close()


def one(spans, name: str) -> ReadableSpan:
    [span] = named(spans, name)
    return span


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


@pytest.mark.urls(__name__)
def test_one_trace_from_the_request_through_two_services(
    spans, kafka_topic, inbox_registry, run_consumer
):
    payments, shipments = kafka_topic(), kafka_topic()
    shipping, warehouse = unique_group(), unique_group()

    @handler(event_type="PaymentCompleted", topic=payments, group=shipping)
    def request_shipment(message: InboxMessage) -> None:
        publish(
            aggregate_type="shipment",
            aggregate_id=message.aggregate_id,
            event_type="ShipmentRequested",
            payload={"payment": message.event_id},
            topic=shipments,
        )

    @handler(event_type="ShipmentRequested", topic=shipments, group=warehouse)
    def pick(message: InboxMessage) -> None:
        pass

    response = Client().get(f"/pay/order-7?topic={payments}", headers={"traceparent": TRACEPARENT})
    assert response.status_code == 201
    assert relay_all() == 1
    consume_until(
        run_consumer(group=shipping),
        lambda: InboxMessage.objects.filter(consumer_group=shipping, status="DONE").exists(),
    )
    assert relay_all() == 1
    consume_until(
        run_consumer(group=warehouse),
        lambda: InboxMessage.objects.filter(consumer_group=warehouse, status="DONE").exists(),
    )

    create_payment, send_payment = one(spans, f"create {payments}"), one(spans, f"send {payments}")
    process_payment = one(spans, f"process {payments}")
    create_shipment, send_shipment = (
        one(spans, f"create {shipments}"),
        one(spans, f"send {shipments}"),
    )
    process_shipment = one(spans, f"process {shipments}")
    chain = [
        create_payment,
        send_payment,
        process_payment,
        create_shipment,
        send_shipment,
        process_shipment,
    ]
    assert len(spans.get_finished_spans()) == len(chain)
    assert {span.context.trace_id for span in chain} == {REMOTE.trace_id}
    # Who is whose parent: the messaging conventions' creation context at each hop.
    assert parent_id(create_payment) == REMOTE.span_id
    assert parent_id(send_payment) == create_payment.context.span_id
    assert parent_id(process_payment) == create_payment.context.span_id
    assert parent_id(create_shipment) == process_payment.context.span_id
    assert parent_id(send_shipment) == create_shipment.context.span_id
    assert parent_id(process_shipment) == create_shipment.context.span_id
    assert [span.kind for span in chain] == [SpanKind.PRODUCER] * 2 + [SpanKind.CONSUMER] + [
        SpanKind.PRODUCER
    ] * 2 + [SpanKind.CONSUMER]

    # What the consumer read is what the relay sent, where the relay says it sent it.
    received = InboxMessage.objects.get(consumer_group=shipping)
    assert received.headers["traceparent"] == traceparent_of(create_payment)
    assert dict(process_payment.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": payments,
        "messaging.destination.partition.id": str(received.partition),
        "messaging.kafka.offset": received.offset,
        "messaging.kafka.message.key": "order-7",
        "messaging.consumer.group.name": shipping,
        "messaging.message.id": received.event_id,
        "inbox.duplicate": False,
        "inbox.outcome": "processed",
    }
    assert send_payment.attributes["messaging.kafka.offset"] == received.offset
    assert send_payment.attributes["messaging.destination.partition.id"] == str(received.partition)
    outgoing = OutboxEvent.objects.get(topic=shipments)
    assert outgoing.headers["traceparent"] == traceparent_of(create_shipment)
    assert create_shipment.attributes["messaging.message.id"] == str(outgoing.id)
    assert process_shipment.attributes["messaging.consumer.group.name"] == warehouse


def test_a_redelivered_duplicate_is_marked_on_its_span(
    spans, kafka_topic, inbox_registry, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    ran: list[str] = []

    @handler(event_type="OrderPlaced", topic=topic, group=group)
    def apply(message: InboxMessage) -> None:
        ran.append(message.event_id)

    event = Event(extra_headers={"traceparent": TRACEPARENT})
    consumer = run_consumer(group=group)
    produce(topic, [event])
    consume_until(consumer, lambda: ran)
    produce(topic, [event])  # the same event again, as a relay that crashed sends it
    consume_until(consumer, lambda: InboxMessage.objects.filter(duplicate_count=1).exists())
    first, again = named(spans, f"process {topic}")
    assert ran == [event.event_id]
    assert (first.attributes["inbox.duplicate"], first.attributes["inbox.outcome"]) == (
        False,
        "processed",
    )
    assert (again.attributes["inbox.duplicate"], again.attributes["inbox.outcome"]) == (
        True,
        "duplicate",
    )
    assert (
        again.attributes["messaging.kafka.offset"] == first.attributes["messaging.kafka.offset"] + 1
    )
    for span in (first, again):
        assert span.context.trace_id == REMOTE.trace_id
        assert parent_id(span) == REMOTE.span_id


def test_a_failed_handler_is_recorded_and_its_retry_by_beat_is_a_new_linked_span(
    spans, kafka_topic, inbox_registry, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    failures = ["once"]

    @handler(event_type="OrderPlaced", topic=topic, group=group)
    def apply(message: InboxMessage) -> None:
        if failures:
            failures.pop()
            logging.getLogger("tests.handler").warning("applying %s", message.event_id)
            raise ValueError("the warehouse is closed")

    consumer = run_consumer(group=group)
    produce(topic, [Event(extra_headers={"traceparent": TRACEPARENT})])
    consume_until(consumer, lambda: InboxMessage.objects.filter(attempts=1).exists())
    [failed] = named(spans, f"process {topic}")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["inbox.outcome"] == "failed"
    assert failed.attributes["error.type"] == "builtins.ValueError"
    [exception] = failed.events
    assert exception.name == "exception"
    assert exception.attributes["exception.message"] == "the warehouse is closed"

    InboxMessage.objects.update(next_attempt_at=timezone.now())
    assert inbox_messages_retry_due(limit=10)["done"] == 1  # what the beat task runs
    [_, retried] = named(spans, f"process {topic}")
    # A trace of its own (the first one ended long ago), linked to the event's creation.
    assert retried.parent is None
    assert retried.context.trace_id != REMOTE.trace_id
    [link] = retried.links
    assert (link.context.trace_id, link.context.span_id) == (REMOTE.trace_id, REMOTE.span_id)
    assert retried.kind is SpanKind.CONSUMER
    assert retried.attributes["inbox.retry"] is True
    assert retried.attributes["inbox.attempt"] == 2
    assert retried.attributes["inbox.outcome"] == "processed"
    assert retried.status.status_code is StatusCode.UNSET


def test_a_handlers_log_lines_carry_the_trace_and_span_ids_of_its_record(
    spans, kafka_topic, inbox_registry, run_consumer
):
    topic, group = kafka_topic(), unique_group()
    lines: list[str] = []

    @handler(event_type="OrderPlaced", topic=topic, group=group)
    def apply(message: InboxMessage) -> None:
        lines.append(log_line(logging.getLogger("inbox.consumer"), f"applying {message.event_id}"))

    event = Event(extra_headers={"traceparent": TRACEPARENT})
    produce(topic, [event])
    consume_until(run_consumer(group=group), lambda: lines)
    [process] = named(spans, f"process {topic}")
    [line] = lines
    assert line.endswith(
        f" WARNING inbox.consumer applying {event.event_id} trace_id={REMOTE.trace_id:032x}"
        f" span_id={process.context.span_id:016x}"
    )


def test_without_an_sdk_the_consumer_and_its_retries_make_no_span_and_work(
    kafka_topic, inbox_registry, run_consumer
):
    assert active_tracer() is None
    topic, group = kafka_topic(), unique_group()
    failures = ["once"]

    @handler(event_type="OrderPlaced", topic=topic, group=group)
    def apply(message: InboxMessage) -> None:
        if failures:
            failures.pop()
            raise ValueError("not yet")

    produce(topic, [Event(extra_headers={"traceparent": TRACEPARENT}), Event()])
    consume_until(
        run_consumer(group=group),
        lambda: InboxMessage.objects.filter(consumer_group=group).count() == 2,
    )
    InboxMessage.objects.update(next_attempt_at=timezone.now())
    assert inbox_messages_retry_due(limit=10)["done"] == 1
    assert set(InboxMessage.objects.values_list("status", flat=True)) == {"DONE"}
    assert uuid.UUID(InboxMessage.objects.first().event_id)


def test_a_span_run_in_ends_with_the_bodys_outcome_or_once_with_an_escaping_exception():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inbox.tracing import running_in

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")

    with running_in(tracer.start_span("kept")) as end:
        end.outcome = "parked"
    with pytest.raises(KeyError), running_in(tracer.start_span("stopped")):
        raise KeyError("the batch stops here")
    kept, stopped = exporter.get_finished_spans()
    assert kept.attributes["inbox.outcome"] == "parked"
    assert kept.status.status_code is StatusCode.UNSET
    assert stopped.attributes["inbox.outcome"] == "failed"
    assert stopped.attributes["error.type"] == "builtins.KeyError"
    assert stopped.status.status_code is StatusCode.ERROR
    [exception] = stopped.events
    assert exception.attributes["exception.type"] == "KeyError"
