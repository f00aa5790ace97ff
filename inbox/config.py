"""The one place where Kafka consumer configuration is built."""

from typing import Any

from inbox.conf import inbox_settings
from kafka_events.kafka import kafka_connection_config

# The inbox's guarantees rest on these; no setting overrides them.
FIXED_CONSUMER_CONFIG: dict[str, Any] = {
    # Offsets are committed by the consumer loop, synchronously, after the database commit.
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # Records of aborted Kafka transactions (a fenced relay's) are never delivered.
    "isolation.level": "read_committed",
}


GROUP_PROTOCOLS = ("classic", "consumer")
# Client properties of the classic group protocol that librdkafka refuses under "consumer"
# (KIP-848), each with what replaces it: the broker decides sessions, heartbeats and the
# assignor's default.
CLASSIC_ONLY_CONFIG = {
    "partition.assignment.strategy": "group.remote.assignor (uniform or range)",
    "session.timeout.ms": "the broker's group.consumer.session.timeout.ms",
    "heartbeat.interval.ms": "the broker's group.consumer.heartbeat.interval.ms",
    "group.protocol.type": "nothing",
}


def inbox_consumer_config(*, group: str, **overrides: Any) -> dict[str, Any]:
    """librdkafka configuration for a consumer of `group`; `overrides` are for tests and
    tools (e.g. a different group.id), and cannot change FIXED_CONSUMER_CONFIG. The group
    protocol is INBOX["GROUP_PROTOCOL"]: "classic", or "consumer" (KIP-848, Kafka 4)."""
    return {
        **kafka_connection_config(),
        "group.id": group,
        "client.id": f"inbox-{group}",
        "group.protocol": inbox_settings.GROUP_PROTOCOL,
        "auto.offset.reset": inbox_settings.AUTO_OFFSET_RESET,
        "max.poll.interval.ms": inbox_settings.MAX_POLL_INTERVAL_MS,
        **inbox_settings.CONSUMER_CONFIG,
        **overrides,
        **FIXED_CONSUMER_CONFIG,
    }
