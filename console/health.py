"""/health/: django-health-check with PostgreSQL, Kafka, Redis, Celery workers and beat."""

import dataclasses
import datetime

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from django.conf import settings
from django.utils import timezone
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable, ServiceWarning
from health_check.views import HealthCheckView
from redis.asyncio import Redis as AsyncRedis

from project.kafka import kafka_connection_config


@dataclasses.dataclass
class Kafka(HealthCheck):
    """Asks the cluster for its metadata with the project's own client settings (security
    protocol, SASL...), which the library's Kafka check does not take."""

    timeout: datetime.timedelta = dataclasses.field(
        default=datetime.timedelta(seconds=3), repr=False
    )

    def run(self) -> None:
        milliseconds = int(self.timeout.total_seconds() * 1000)
        admin = AdminClient(
            {
                **kafka_connection_config(),
                "socket.timeout.ms": milliseconds,
                "socket.connection.setup.timeout.ms": milliseconds,
            }
        )
        try:
            metadata = admin.list_topics(timeout=self.timeout.total_seconds())
        except KafkaException as error:
            raise ServiceUnavailable("Kafka unreachable") from error
        if not metadata.brokers:
            raise ServiceUnavailable("Kafka answered with no brokers")


@dataclasses.dataclass
class CeleryBeat(HealthCheck):
    """Beat's last tick, as django-celery-beat records it (PeriodicTask.last_run_at)."""

    def run(self) -> None:
        from console.selectors import _beat_last_tick

        last = _beat_last_tick()
        if last is None:
            raise ServiceWarning("Celery beat has never ticked")
        age = (timezone.now() - last).total_seconds()
        if age > settings.CONSOLE_BEAT_STALE_SECONDS[1]:
            raise ServiceUnavailable(f"Celery beat's last tick was {int(age)} s ago")


def redis_client() -> AsyncRedis:
    return AsyncRedis.from_url(
        settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2
    )


HEALTH_CHECKS = (
    "health_check.checks.Database",
    "console.health.Kafka",
    ("health_check.contrib.redis.Redis", {"client_factory": redis_client}),
    ("health_check.contrib.celery.Ping", {"timeout": datetime.timedelta(seconds=2)}),
    "console.health.CeleryBeat",
)

health_view = HealthCheckView.as_view(checks=HEALTH_CHECKS)
