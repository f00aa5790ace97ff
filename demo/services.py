"""The demo's writes: a payment with its event, a delivery started by that event, and a
duplicate delivery of a record, as a producer retry or a rebalance would cause."""

import json
import random
import uuid
from decimal import Decimal
from typing import Any

from confluent_kafka import Producer
from django.conf import settings
from django.db import transaction

import outbox
from demo.errors import InjectedFailure
from demo.models import Delivery, Payment
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from outbox.relay import record_headers
from outbox.services.event_log.spans import LogEvent
from outbox.services.publish import encode_payload


def payment_complete(*, order_id: str, amount: Decimal) -> Payment:
    """Completes a payment and records PaymentCompleted in the same transaction: if the
    transaction rolls back, neither exists; Kafka is never called here."""
    with transaction.atomic():
        payment = Payment.objects.create(order_id=order_id, amount=amount)
        outbox.publish(
            aggregate_type="payment",
            aggregate_id=payment.id,
            event_type="PaymentCompleted",
            payload={"payment_id": str(payment.id), "order_id": order_id, "amount": amount},
            topic=settings.DEMO_PAYMENTS_TOPIC,
        )
    return payment


def delivery_start(*, message: InboxMessage) -> Delivery:
    """Starts the delivery of a completed payment. Runs inside the inbox's transaction: the
    delivery, its DeliveryStarted event and the inbox row commit together or not at all."""
    if random.random() < settings.DEMO_HANDLER_FAILURE_RATE:
        raise InjectedFailure(
            f"injected failure (DEMO_HANDLER_FAILURE_RATE={settings.DEMO_HANDLER_FAILURE_RATE})"
        )
    payload: dict[str, Any] = message.payload or {}
    delivery, created = Delivery.objects.get_or_create(
        payment_id=uuid.UUID(payload["payment_id"]),
        defaults={"order_id": payload.get("order_id", ""), "event_id": message.event_id},
    )
    if created and settings.DEMO_CHAIN:
        outbox.publish(
            aggregate_type="delivery",
            aggregate_id=delivery.pk,
            event_type="DeliveryStarted",
            payload={"delivery_id": delivery.pk, "payment_id": payload["payment_id"]},
            topic=settings.DEMO_DELIVERIES_TOPIC,
        )
    return delivery


def demo_duplicate_send(*, event: OutboxEvent, producer: Producer) -> None:
    """Sends a published event's record once more, exactly as the relay did (same event id):
    the consumer must count it as a duplicate and not start a second delivery."""
    sent = LogEvent(
        id=event.id,
        aggregate_type=event.aggregate_type,
        aggregate_id=event.aggregate_id,
        event_type=event.event_type,
        payload_json=encode_payload(event.payload).decode(),
        headers_json=json.dumps(event.headers),
        topic=event.topic,
        key=event.key,
        created_at=event.created_at,
        # Where the relay read the event in the log: none of it travels in the record.
        txid=0,
        position=event.position,
        shard=0,
    )
    producer.produce(
        event.topic,
        key=event.key.encode(),
        value=sent.payload_json.encode(),
        headers=record_headers(sent),
    )
