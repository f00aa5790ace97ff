"""The relay's Kafka producer: its configuration, built in this one place, and one lazily
created instance per process (never created before a fork, so safe under Celery's prefork)."""

import logging
import os
import threading
from typing import Any

from confluent_kafka import KafkaError, Producer
from django.conf import settings

from project.kafka import kafka_connection_config

logger = logging.getLogger(__name__)

# Not overridable by OUTBOX_PRODUCER_CONFIG: the outbox's guarantees rest on them.
GUARANTEED_PRODUCER_CONFIG = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
}


def producer_config(*, transactional_id: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {
        **kafka_connection_config(),
        "linger.ms": settings.OUTBOX_PRODUCER_LINGER_MS,
        "batch.size": settings.OUTBOX_PRODUCER_BATCH_SIZE,
        "compression.type": settings.OUTBOX_PRODUCER_COMPRESSION,
        "message.timeout.ms": settings.OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS,
        **settings.OUTBOX_PRODUCER_CONFIG,
        **GUARANTEED_PRODUCER_CONFIG,
    }
    if transactional_id:
        config["transactional.id"] = transactional_id
        # A transaction may stay open at most as long as a batch may take to deliver.
        config["transaction.timeout.ms"] = max(
            60_000, settings.OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS * 2
        )
    return config


class RelayProducer:
    """Wraps a confluent-kafka Producer and remembers whether it has hit a fatal error."""

    def __init__(self, *, transactional_id: str | None = None) -> None:
        self.transactional_id = transactional_id
        self.fatal_error: KafkaError | None = None
        self.pid = os.getpid()
        config = producer_config(transactional_id=transactional_id)
        config["error_cb"] = self._on_error
        self.producer = Producer(config)
        if transactional_id:
            self.producer.init_transactions(settings.OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS / 1000)

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self.fatal_error = error
            logger.error("Outbox producer hit a fatal error: %s", error)
        else:
            # Transient (a broker down, a connection refused): librdkafka retries by itself.
            logger.warning("Outbox producer: %s", error)

    def close(self, timeout: float = 10.0) -> None:
        # A fatal producer cannot flush; its undelivered messages are reported as failed.
        if self.fatal_error is None:
            self.producer.flush(timeout)


_lock = threading.Lock()
_producers: dict[str | None, RelayProducer] = {}


def get_producer(*, transactional_id: str | None = None) -> RelayProducer:
    """This process's producer, created on first use and recreated after a fork or a fatal error."""
    with _lock:
        current = _producers.get(transactional_id)
        if current is not None and (current.pid != os.getpid() or current.fatal_error):
            _producers.pop(transactional_id, None)
            current = None
        if current is None:
            current = RelayProducer(transactional_id=transactional_id)
            _producers[transactional_id] = current
        return current


def discard_producer(producer: RelayProducer) -> None:
    """Drops a producer after a fatal error; the next get_producer() builds a new one."""
    with _lock:
        if _producers.get(producer.transactional_id) is producer:
            del _producers[producer.transactional_id]


def close_producers() -> None:
    with _lock:
        producers = list(_producers.values())
        _producers.clear()
    for producer in producers:
        if producer.pid == os.getpid():
            producer.close()
