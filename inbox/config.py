"""The one place where Kafka consumer configuration is built."""

from typing import Any

from django.conf import settings

from project.kafka import kafka_connection_config

# The inbox's guarantees rest on these; no setting overrides them.
FIXED_CONSUMER_CONFIG: dict[str, Any] = {
    # Offsets are committed by the consumer loop, synchronously, after the database commit.
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # Records of aborted Kafka transactions (a fenced relay's) are never delivered.
    "isolation.level": "read_committed",
}


def inbox_consumer_config(*, group: str, **overrides: Any) -> dict[str, Any]:
    """librdkafka configuration for a consumer of `group`; `overrides` are for tests and
    tools (e.g. a different group.id), and cannot change FIXED_CONSUMER_CONFIG."""
    return {
        **kafka_connection_config(),
        "group.id": group,
        "client.id": f"inbox-{group}",
        "auto.offset.reset": settings.INBOX_AUTO_OFFSET_RESET,
        "max.poll.interval.ms": settings.INBOX_MAX_POLL_INTERVAL_MS,
        **settings.INBOX_CONSUMER_CONFIG,
        **overrides,
        **FIXED_CONSUMER_CONFIG,
    }
