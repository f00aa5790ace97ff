"""The relay's Kafka producer: its configuration, built in this one place, and one lazily
created instance per process (never created before a fork, so safe under Celery's prefork)."""

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from kafka_events.kafka import kafka_connection_config
from outbox.conf import outbox_settings

logger = logging.getLogger(__name__)
# How long a read of one topic's metadata, after its refusal of a record, may take.
METADATA_REFRESH_SECONDS = 5.0

# Not overridable by OUTBOX["PRODUCER_CONFIG"]: the outbox's guarantees rest on them.
GUARANTEED_PRODUCER_CONFIG = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
}

# The producer properties the relay sets itself, under each of librdkafka's names for them,
# with the hint of check outbox.E007, which refuses them in OUTBOX["PRODUCER_CONFIG"]: the
# relay waits for delivery reports as long as message.timeout.ms lets a record stay in flight
# (a longer one would leave records in flight after the relay counted them as failed, to be
# sent again: duplicates), and names and times its transactions itself.
_FIXED = (
    "Remove it: the outbox fixes it (an idempotent producer, acks=all, at most 5 requests in "
    "flight)."
)
_DELIVERY_TIMEOUT = f"Remove it and set {outbox_settings.name('PRODUCER_DELIVERY_TIMEOUT_MS')}."
RELAY_OWNED_PRODUCER_CONFIG = {
    "enable.idempotence": _FIXED,
    "acks": _FIXED,
    "request.required.acks": _FIXED,
    "max.in.flight.requests.per.connection": _FIXED,
    "max.in.flight": _FIXED,
    "message.timeout.ms": _DELIVERY_TIMEOUT,
    "delivery.timeout.ms": _DELIVERY_TIMEOUT,
    "transactional.id": f"Remove it and set {outbox_settings.name('RELAY_TRANSACTIONAL')} and "
    f"{outbox_settings.name('TRANSACTIONAL_ID_PREFIX')}: each relay slot gets its own id.",
    "transaction.timeout.ms": "Remove it: a transaction may last twice "
    f"{outbox_settings.name('PRODUCER_DELIVERY_TIMEOUT_MS')}, at least 60 s; set that.",
}

# librdkafka's partitioners that place a record by a hash of its key: every event of a key in
# one partition, which order per key rests on. An event's key is never empty, so the *_random
# variants (random only for an empty key) keep it too; murmur2 is the Java client's. "random"
# ignores the key: refused by check outbox.E008 and ignored by the producer.
KEY_PARTITIONERS = frozenset(
    {"consistent", "consistent_random", "murmur2", "murmur2_random", "fnv1a", "fnv1a_random"}
)


def ignored_producer_config(extra: dict[str, Any]) -> list[str]:
    """The keys of OUTBOX["PRODUCER_CONFIG"] the producer leaves out: those the relay sets
    itself, and a partitioner that does not place records by their key."""
    return sorted(
        key
        for key, value in extra.items()
        if key in RELAY_OWNED_PRODUCER_CONFIG
        or (key == "partitioner" and value not in KEY_PARTITIONERS)
    )


def producer_config(*, transactional_id: str | None = None) -> dict[str, Any]:
    extra = outbox_settings.PRODUCER_CONFIG
    ignored = ignored_producer_config(extra)
    if ignored:
        # Check outbox.E007 refuses them, but a Celery worker starts whatever its checks find.
        logger.warning(
            'Outbox producer ignores %s of OUTBOX["PRODUCER_CONFIG"] (see outbox.E007, E008)',
            ", ".join(ignored),
        )
    delivery_timeout_ms = outbox_settings.PRODUCER_DELIVERY_TIMEOUT_MS
    config: dict[str, Any] = {
        **kafka_connection_config(),
        "linger.ms": outbox_settings.PRODUCER_LINGER_MS,
        "batch.size": outbox_settings.PRODUCER_BATCH_SIZE,
        "compression.type": outbox_settings.PRODUCER_COMPRESSION,
        **{key: value for key, value in extra.items() if key not in ignored},
        "message.timeout.ms": delivery_timeout_ms,
        **GUARANTEED_PRODUCER_CONFIG,
    }
    if transactional_id:
        config["transactional.id"] = transactional_id
        # A transaction may stay open at most as long as a batch may take to deliver.
        config["transaction.timeout.ms"] = max(60_000, delivery_timeout_ms * 2)
    return config


class RelayProducer:
    """Wraps a confluent-kafka Producer and remembers whether it has hit a fatal error."""

    def __init__(self, *, transactional_id: str | None = None) -> None:
        self.transactional_id = transactional_id
        self.fatal_error: KafkaError | None = None
        self.pid = os.getpid()
        # Topics a record was refused for as a topic (outbox.relay.TOPIC_REFUSALS): their
        # metadata is asked again before the next record to them (refresh_refused_topics).
        self.refused_topics: set[str] = set()
        config = producer_config(transactional_id=transactional_id)
        # How long a record may stay in flight before its delivery report says it failed: the
        # relay waits that long for the reports of a batch, and no shorter.
        self.delivery_timeout_seconds: float = config["message.timeout.ms"] / 1000
        config["error_cb"] = self._on_error
        self.producer = Producer(config)
        if transactional_id:
            self.producer.init_transactions(self.delivery_timeout_seconds)
            logger.debug(
                "Outbox producer %s is ready: any earlier producer of this transactional.id "
                "is fenced",
                transactional_id,
            )

    def refresh_refused_topics(self, topics: set[str]) -> None:
        """Asks the cluster again for the metadata of those of `topics` that refused a record
        as a topic (its user may not write it, or it did not exist). librdkafka keeps that
        answer in its cache until its next refresh and would refuse the records sent after
        the grant or the topic's creation, such as an operator's retry of a held key."""
        for topic in topics & self.refused_topics:
            try:
                self.producer.list_topics(topic, timeout=METADATA_REFRESH_SECONDS)
            except KafkaException as error:
                logger.info("Outbox producer cannot read %s's metadata again: %s", topic, error)
                continue
            self.refused_topics.discard(topic)

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
    """Closes this process's producers and forgets the topic limits it read."""
    global _topic_admin
    with _lock:
        producers = list(_producers.values())
        _producers.clear()
        _topic_limits.clear()
        _topic_admin = None
    for producer in producers:
        if producer.pid == os.getpid():
            producer.close()


# A topic's max.message.bytes is read again after this long, or after the shorter time when
# it could not be read (the topic not created yet, the cluster unreachable).
TOPIC_LIMIT_TTL_SECONDS = 300.0
TOPIC_LIMIT_UNKNOWN_TTL_SECONDS = 30.0
TOPIC_CONFIG_TIMEOUT_SECONDS = 2.0
_topic_limits: dict[str, tuple[float, int | None]] = {}
_topic_limits_pid = os.getpid()
_topic_admin: AdminClient | None = None


def topic_record_limits(topics: Iterable[str]) -> dict[str, int]:
    """max.message.bytes of each topic the broker can describe, read at most every
    TOPIC_LIMIT_TTL_SECONDS. A topic it cannot (not created yet, the cluster unreachable) has
    no entry: its records go to the broker, which decides."""
    global _topic_limits_pid, _topic_admin
    with _lock:
        if _topic_limits_pid != os.getpid():
            _topic_limits.clear()
            _topic_limits_pid, _topic_admin = os.getpid(), None
        now = time.monotonic()
        wanted = {t for t in topics if t not in _topic_limits or _topic_limits[t][0] < now}
        if wanted:
            if _topic_admin is None:
                _topic_admin = AdminClient(kafka_connection_config())
            _topic_limits.update(_describe_limits(_topic_admin, wanted, now=now))
        return {
            topic: limit
            for topic in topics
            if (limit := _topic_limits.get(topic, (0.0, None))[1]) is not None
        }


def _describe_limits(
    admin: AdminClient, topics: set[str], *, now: float
) -> dict[str, tuple[float, int | None]]:
    futures = admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in sorted(topics)],
        request_timeout=TOPIC_CONFIG_TIMEOUT_SECONDS,
    )
    limits: dict[str, tuple[float, int | None]] = {}
    for resource, future in futures.items():
        try:
            config = future.result(timeout=TOPIC_CONFIG_TIMEOUT_SECONDS)
            limit = int(config["max.message.bytes"].value)
            limits[resource.name] = (now + TOPIC_LIMIT_TTL_SECONDS, limit)
        except (KafkaException, KeyError, ValueError, TimeoutError) as error:
            logger.info("Outbox producer cannot read %s's record limit: %s", resource.name, error)
            limits[resource.name] = (now + TOPIC_LIMIT_UNKNOWN_TTL_SECONDS, None)
    return limits
