"""Connection settings every Kafka client shares. Each direction builds its own client
configuration on top of this: the producer in outbox/producer.py, consumers in inbox/."""

from typing import Any

from kafka_events.conf import kafka_settings


def kafka_connection_config() -> dict[str, Any]:
    return {
        "bootstrap.servers": kafka_settings.BOOTSTRAP_SERVERS,
        **kafka_settings.CLIENT_CONFIG,
    }
