"""Connection settings every Kafka client shares. Each direction builds its own client
configuration on top of this: the producer in outbox/producer.py, consumers in inbox/."""

from typing import Any

from django.conf import settings


def kafka_connection_config() -> dict[str, Any]:
    return {
        "bootstrap.servers": settings.KAFKA_BOOTSTRAP_SERVERS,
        **settings.KAFKA_CLIENT_CONFIG,
    }
