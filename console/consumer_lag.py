"""Consumer group lag, read from Kafka: committed offsets against high watermarks, with a
short timeout whose failure is a state to show (`reachable` false), never an error page, and
cached so that a refreshing dashboard does not hammer the brokers."""

import functools
import hashlib
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from kafka_events.conf import kafka_settings
from kafka_events.kafka import kafka_connection_config

logger = logging.getLogger(__name__)

# Kafka's "no committed offset" sentinel (OFFSET_INVALID).
NO_OFFSET = -1001


@dataclass
class PartitionLag:
    group: str
    topic: str
    partition: int
    committed: int | None
    high_watermark: int
    lag: int


@dataclass
class ConsumerLag:
    reachable: bool
    error: str = ""
    partitions: list[PartitionLag] = field(default_factory=list)
    checked_at: str = ""

    def total_by_group(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for row in self.partitions:
            totals[row.group] = totals.get(row.group, 0) + row.lag
        return totals

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_by_group": self.total_by_group()}


def console_consumer_groups() -> dict[str, list[str]]:
    """Groups to watch and their topics: the groups with handlers here, and the configured ones
    (whose topics are those they committed offsets for)."""
    from inbox.registry import get_registry

    registry = get_registry()
    groups: dict[str, list[str]] = {group: registry.topics(group) for group in registry.groups()}
    for group in settings.CONSOLE_CONSUMER_GROUPS:
        groups.setdefault(group, [])
    return groups


def _admin_client(timeout: float) -> AdminClient:
    # One client per process and configuration, kept: a new one per dashboard refresh paid
    # its connection set-up every time. Keyed by pid too, since a librdkafka client does not
    # survive a fork (gunicorn and Celery fork their workers).
    return _process_admin_client(
        os.getpid(), kafka_settings.BOOTSTRAP_SERVERS, max(1, int(timeout * 1000))
    )


def _client_timeouts(milliseconds: int) -> dict[str, Any]:
    return {
        **kafka_connection_config(),
        "socket.timeout.ms": milliseconds,
        "socket.connection.setup.timeout.ms": milliseconds,
        "reconnect.backoff.max.ms": milliseconds,
    }


@functools.lru_cache(maxsize=4)
def _process_admin_client(pid: int, bootstrap_servers: str, milliseconds: int) -> AdminClient:
    return AdminClient(_client_timeouts(milliseconds))


def _offsets_reader(group: str, timeout: float) -> Consumer:
    # Kept per process like the admin client: the group's coordinator is looked up once.
    return _process_offsets_reader(
        os.getpid(), kafka_settings.BOOTSTRAP_SERVERS, group, max(1, int(timeout * 1000))
    )


@functools.lru_cache(maxsize=64)
def _process_offsets_reader(
    pid: int, bootstrap_servers: str, group: str, milliseconds: int
) -> Consumer:
    """A consumer of `group` that only reads its committed offsets: it never subscribes, so it
    never joins the group. The admin client's ListConsumerGroupOffsets is not used: when the
    coordinator answers NOT_COORDINATOR (a broker that has just created __consumer_offsets, a
    coordinator that moved) librdkafka re-queries the coordinator through the client's
    consumer group, which an admin client does not have, and the process dies of a
    segmentation fault (librdkafka issue 5040). A consumer has one: it looks the coordinator
    up again, and _committed asks again."""
    return Consumer(
        {**_client_timeouts(milliseconds), "group.id": group, "enable.auto.commit": False}
    )


# A group coordinator that is loading or has moved: the consumer looks it up again, and the
# read is asked again within the timeout.
COORDINATOR_NOT_READY = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
COORDINATOR_RETRY_SECONDS = 0.2


def _committed(
    group: str, partitions: list[TopicPartition], timeout: float
) -> list[TopicPartition]:
    """The committed offsets of `group` in `partitions`, read within `timeout` seconds."""
    reader = _offsets_reader(group, timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return reader.committed(partitions, timeout=max(0.1, deadline - time.monotonic()))
        except KafkaException as error:
            if error.args[0].code() not in COORDINATOR_NOT_READY or time.monotonic() >= deadline:
                raise
        time.sleep(COORDINATOR_RETRY_SECONDS)


def _read_consumer_lag(groups: dict[str, list[str]], timeout: float) -> ConsumerLag:
    admin = _admin_client(timeout)
    metadata = admin.list_topics(timeout=timeout)
    # A group with no topics known here (a configured one) is asked for every topic's
    # partitions, and shows those it committed an offset for.
    every_topic = [topic for topic in metadata.topics if not topic.startswith("__")]
    committed: dict[tuple[str, str, int], int] = {}
    for group, topics in groups.items():
        partitions = [
            TopicPartition(topic, partition)
            for topic in topics or every_topic
            if topic in metadata.topics
            for partition in sorted(metadata.topics[topic].partitions)
        ]
        if not partitions:
            continue
        for tp in _committed(group, partitions, timeout):
            if topics or tp.offset >= 0:
                committed[(group, tp.topic, tp.partition)] = tp.offset
    partitions_needed = {(topic, partition) for _, topic, partition in committed}
    highs: dict[tuple[str, int], int] = {}
    if partitions_needed:
        futures = admin.list_offsets(
            {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions_needed},
            request_timeout=timeout,
        )
        for tp, future in futures.items():
            highs[(tp.topic, tp.partition)] = future.result(timeout=timeout + 1).offset
    rows = []
    for (group, topic, partition), offset in sorted(committed.items()):
        high = highs.get((topic, partition), 0)
        has_commit = offset is not None and offset >= 0
        rows.append(
            PartitionLag(
                group=group,
                topic=topic,
                partition=partition,
                committed=offset if has_commit else None,
                high_watermark=high,
                # A group with no commit yet has the whole log ahead of it (auto.offset.reset
                # earliest); the log start is not subtracted, so this is an upper bound.
                lag=max(0, high - offset) if has_commit else high,
            )
        )
    return ConsumerLag(reachable=True, partitions=rows, checked_at=timezone.now().isoformat())


def consumer_lag(*, use_cache: bool = True) -> ConsumerLag:
    """Committed offset against high watermark per group, topic and partition, read from Kafka
    within CONSOLE_KAFKA_TIMEOUT_SECONDS. An unreachable Kafka gives reachable=False."""
    groups = console_consumer_groups()
    # Hashed: group names and addresses may hold characters cache backends refuse in keys.
    scope = hashlib.sha256(f"{kafka_settings.BOOTSTRAP_SERVERS}|{sorted(groups)}".encode())
    key = f"console:consumer-lag:{scope.hexdigest()[:32]}"
    if use_cache:
        cached = cache.get(key)
        if cached is not None:
            return ConsumerLag(
                reachable=cached["reachable"],
                error=cached["error"],
                partitions=[PartitionLag(**row) for row in cached["partitions"]],
                checked_at=cached["checked_at"],
            )
    try:
        lag = _read_consumer_lag(groups, settings.CONSOLE_KAFKA_TIMEOUT_SECONDS)
    except (KafkaException, TimeoutError, OSError, ValueError) as error:
        logger.info("Kafka unreachable for the console: %s", error)
        lag = ConsumerLag(
            reachable=False,
            error=f"Kafka unreachable at {kafka_settings.BOOTSTRAP_SERVERS}: "
            f"{error.__class__.__name__}: {error}"[:500],
            checked_at=timezone.now().isoformat(),
        )
    except Exception as error:  # futures raise plain exceptions for broker-side errors
        logger.warning("Kafka lag read failed: %s", error)
        lag = ConsumerLag(
            reachable=False,
            error=f"Kafka lag unavailable: {error}"[:500],
            checked_at=timezone.now().isoformat(),
        )
    cache.set(key, asdict(lag), settings.CONSOLE_KAFKA_CACHE_SECONDS)
    return lag
