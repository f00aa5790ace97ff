"""The demo: a payment and its event in one transaction; the delivery handler, its injected
failures and its chained event; duplicates; and DEMO_ENABLED=false leaving no handler."""

import json
import subprocess
import sys
import uuid
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import transaction

from demo.errors import InjectedFailure
from demo.models import Delivery, Payment
from demo.services import delivery_start, payment_complete
from inbox.models import InboxMessage
from inbox.registry import get_registry
from outbox.models import OutboxEvent

pytestmark = pytest.mark.django_db


def _message_for(event: OutboxEvent) -> InboxMessage:
    return InboxMessage(
        event_id=str(event.pk),
        consumer_group=settings.DEMO_DELIVERY_GROUP,
        topic=event.topic,
        partition=0,
        offset=0,
        event_type=event.event_type,
        payload=event.payload,
    )


def test_a_payment_and_its_event_commit_together():
    payment = payment_complete(order_id="order-1", amount=Decimal("12.50"))
    event = OutboxEvent.objects.get()
    assert event.event_type == "PaymentCompleted"
    assert event.aggregate_id == str(payment.id)
    assert event.topic == settings.DEMO_PAYMENTS_TOPIC
    assert event.payload["amount"] == "12.50"


def test_a_rolled_back_payment_leaves_no_event():
    with pytest.raises(RuntimeError), transaction.atomic():
        payment_complete(order_id="order-2", amount=Decimal(1))
        raise RuntimeError("the business transaction fails later")
    assert not Payment.objects.exists()
    assert not OutboxEvent.objects.exists()


def test_the_handler_is_registered_for_the_delivery_group():
    entry = get_registry().get(group=settings.DEMO_DELIVERY_GROUP, event_type="PaymentCompleted")
    assert entry is not None
    assert entry.topic == settings.DEMO_PAYMENTS_TOPIC


def test_the_delivery_starts_once_and_chains_delivery_started(settings):
    settings.DEMO_HANDLER_FAILURE_RATE = 0.0
    payment_complete(order_id="order-3", amount=Decimal(5))
    message = _message_for(OutboxEvent.objects.get())
    with transaction.atomic():
        delivery_start(message=message)
        delivery_start(message=message)  # a redelivery that got past dedup: still one
    assert Delivery.objects.count() == 1
    started = OutboxEvent.objects.get(event_type="DeliveryStarted")
    assert started.topic == settings.DEMO_DELIVERIES_TOPIC


def test_injected_failures(settings):
    settings.DEMO_HANDLER_FAILURE_RATE = 1.0
    payment_complete(order_id="order-4", amount=Decimal(5))
    with pytest.raises(InjectedFailure), transaction.atomic():
        delivery_start(message=_message_for(OutboxEvent.objects.get()))
    assert not Delivery.objects.exists()


@pytest.mark.kafka
def test_demo_traffic_completes_payments(settings):
    settings.DEMO_PAYMENTS_TOPIC = f"test.demo.payments.{uuid.uuid4().hex[:8]}"
    settings.DEMO_DELIVERIES_TOPIC = f"test.demo.deliveries.{uuid.uuid4().hex[:8]}"
    call_command("demo_traffic", "--count", "3", "--rate", "50", "--duplicate-rate", "0")
    assert Payment.objects.count() == 3
    assert OutboxEvent.objects.filter(event_type="PaymentCompleted").count() == 3
    from confluent_kafka.admin import AdminClient

    from kafka_events.kafka import kafka_connection_config

    admin = AdminClient(kafka_connection_config())
    for future in admin.delete_topics(
        [settings.DEMO_PAYMENTS_TOPIC, settings.DEMO_DELIVERIES_TOPIC]
    ).values():
        future.result(timeout=30)


def test_duplicates_are_sent_of_published_payments_only():
    from django.utils import timezone

    from demo.management.commands.demo_traffic import Command
    from outbox.models import OutboxDelivery

    assert Command()._recent_published() is None
    payment_complete(order_id="order-8", amount=Decimal(3))
    payment_complete(order_id="order-9", amount=Decimal(4))
    published, _waiting = OutboxEvent.objects.order_by("position")
    assert Command()._recent_published() is None
    OutboxDelivery.objects.create(
        event_id=published.pk,
        outcome=OutboxDelivery.Outcome.PUBLISHED,
        published_at=timezone.now(),
        kafka_partition=0,
        kafka_offset=0,
        relay="test",
    )
    assert Command()._recent_published() == published


def _manage(*arguments: str, demo: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "manage.py", *arguments],
        cwd=settings.BASE_DIR,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings.local",
            "DEMO_ENABLED": demo,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_demo_enabled_false_registers_no_handler_and_installs_no_app():
    off = _manage("inbox_consume", "--list-groups", demo="false")
    assert off.returncode == 0, off.stderr
    assert settings.DEMO_DELIVERY_GROUP not in off.stdout.split()
    on = _manage("inbox_consume", "--list-groups", demo="true")
    assert settings.DEMO_DELIVERY_GROUP in on.stdout.split()
    apps = _manage(
        "shell",
        "-c",
        "from django.apps import apps; print(apps.is_installed('demo'))",
        demo="false",
    )
    assert apps.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.kafka
def test_a_duplicate_send_repeats_the_record_with_the_same_event_id(
    kafka_topic, kafka_consumer_config
):
    from confluent_kafka import Consumer, Producer

    from demo.services import demo_duplicate_send
    from kafka_events.kafka import kafka_connection_config

    topic = kafka_topic()
    payment_complete(order_id="order-5", amount=Decimal(7))
    event = OutboxEvent.objects.get()
    OutboxEvent.objects.filter(pk=event.pk).update(topic=topic)
    event.refresh_from_db()
    producer = Producer(kafka_connection_config())
    demo_duplicate_send(event=event, producer=producer)
    producer.flush(10)
    consumer = Consumer(kafka_consumer_config)
    consumer.subscribe([topic])
    message = None
    for _ in range(30):
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            break
    consumer.close()
    assert message is not None
    headers = {name: value.decode() for name, value in message.headers() or []}
    assert headers["event_id"] == str(event.pk)
    assert headers["event_type"] == "PaymentCompleted"
    assert json.loads(message.value())["order_id"] == "order-5"


@pytest.mark.parametrize("arguments", [["--rate", "0"], ["--rate", "-2"]])
def test_a_rate_that_is_not_positive_is_refused(arguments):
    with pytest.raises(CommandError, match="rate must be above 0"):
        call_command("demo_traffic", *arguments, "--count", "1")
