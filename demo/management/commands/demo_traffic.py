import random
import signal
import time
from decimal import Decimal
from types import FrameType
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo.services import demo_duplicate_send, payment_complete
from kafka_events.kafka import kafka_connection_config
from kafka_events.tracing import configure_tracing
from outbox.models import OutboxEvent
from outbox.selectors import outbox_events_with_delivery

TOPIC_PARTITIONS = 3
# Duplicates are sent of the latest this many published events.
RECENT_EVENTS = 50


class Command(BaseCommand):
    help = (
        "Demo traffic: completes payments at DEMO_RATE per second (PaymentCompleted through "
        "the outbox) and re-sends DEMO_DUPLICATE_RATE of the published records, so the console "
        "shows PENDING, DONE and FAILED rows, retries, duplicates and lag. SIGTERM stops it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rate", type=float, help="Payments per second (DEMO_RATE).")
        parser.add_argument(
            "--duplicate-rate", type=float, help="Share re-sent (DEMO_DUPLICATE_RATE)."
        )
        parser.add_argument("--count", type=int, help="Stop after this many payments.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEMO_ENABLED:
            self.stderr.write("DEMO_ENABLED is false: no demo traffic.")
            return
        rate = settings.DEMO_RATE if options["rate"] is None else options["rate"]
        if rate <= 0:
            raise CommandError(
                f"The rate must be above 0 payments per second, got {rate} (--rate or "
                "DEMO_RATE); set DEMO_ENABLED=false to switch the demo off."
            )
        # Each payment's create span is the root of its trace (POST /demo/payments/ starts
        # one from an HTTP request instead).
        configure_tracing(service_name="demo-traffic")
        duplicate_rate = (
            settings.DEMO_DUPLICATE_RATE
            if options["duplicate_rate"] is None
            else options["duplicate_rate"]
        )
        self._create_topics()
        running = True

        def stop(signum: int, frame: FrameType | None) -> None:
            nonlocal running
            running = False

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        producer: Producer | None = None
        sent = duplicates = 0
        interval = 1.0 / rate
        try:
            while running and (options["count"] is None or sent < options["count"]):
                started = time.monotonic()
                payment_complete(
                    order_id=f"order-{random.randint(1, 10_000)}",
                    amount=Decimal(random.randint(100, 100_000)) / 100,
                )
                sent += 1
                if duplicate_rate and random.random() < duplicate_rate:
                    event = self._recent_published()
                    if event is not None:
                        producer = producer or Producer(kafka_connection_config())
                        demo_duplicate_send(event=event, producer=producer)
                        producer.poll(0)
                        duplicates += 1
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
        finally:
            if producer is not None:
                producer.flush(10)
        self.stdout.write(f"demo traffic: {sent} payments, {duplicates} duplicate records sent")

    def _recent_published(self) -> OutboxEvent | None:
        # Newest first (the relay's index serves it): the delivery of each is computed only
        # for the rows walked until enough are found, not for the whole table.
        payments = OutboxEvent.objects.filter(event_type="PaymentCompleted")
        recent = list(
            outbox_events_with_delivery(payments)
            .filter(delivery_status=OutboxEvent.Status.DONE)
            .order_by("-transaction_id", "-position")[:RECENT_EVENTS]
        )
        return random.choice(recent) if recent else None

    def _create_topics(self) -> None:
        admin = AdminClient(kafka_connection_config())
        topics = [settings.DEMO_PAYMENTS_TOPIC, settings.DEMO_DELIVERIES_TOPIC]
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=TOPIC_PARTITIONS) for topic in topics]
        )
        for topic, future in futures.items():
            try:
                future.result(timeout=30)
            except KafkaException as error:
                if "TOPIC_ALREADY_EXISTS" not in str(error):
                    raise
            else:
                self.stdout.write(f"created topic {topic}")
