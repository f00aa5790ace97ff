"""/health/: django-health-check with PostgreSQL, Kafka, Redis, Celery workers and beat,
behind HEALTH_TOKEN, its answer kept for HEALTH_CACHE_SECONDS."""

import dataclasses
import datetime
import functools
import time
from typing import Any

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable
from health_check.views import HealthCheckView

from console.metrics import monitoring_access_refusal
from kafka_events.kafka import kafka_connection_config


@functools.cache
def _kafka_admin_client(connection: tuple[tuple[str, Any], ...], *, timeout_ms: int) -> AdminClient:
    """One admin client per process (and connection settings): librdkafka keeps its
    connections and reconnects by itself, where a client per check opened new ones each time."""
    return AdminClient(
        {
            **dict(connection),
            "socket.timeout.ms": timeout_ms,
            "socket.connection.setup.timeout.ms": timeout_ms,
        }
    )


@dataclasses.dataclass
class Kafka(HealthCheck):
    """Asks the cluster for its metadata with the project's own client settings (security
    protocol, SASL...), which the library's Kafka check does not take."""

    timeout: datetime.timedelta = dataclasses.field(
        default=datetime.timedelta(seconds=3), repr=False
    )

    def run(self) -> None:
        milliseconds = int(self.timeout.total_seconds() * 1000)
        admin = _kafka_admin_client(
            tuple(sorted(kafka_connection_config().items())), timeout_ms=milliseconds
        )
        try:
            metadata = admin.list_topics(timeout=self.timeout.total_seconds())
        except KafkaException as error:
            raise ServiceUnavailable("Kafka unreachable") from error
        if not metadata.brokers:
            raise ServiceUnavailable("Kafka answered with no brokers")


@dataclasses.dataclass
class CeleryBeat(HealthCheck):
    """Beat's last tick, from its heartbeat (console/beat.py)."""

    def run(self) -> None:
        from console.beat import beat_last_tick

        try:
            last = beat_last_tick()
        except (redis.RedisError, OSError) as error:
            raise ServiceUnavailable("Celery beat's heartbeat cannot be read") from error
        if last is None:
            raise ServiceUnavailable("Celery beat has no heartbeat: not running")
        age = (timezone.now() - last).total_seconds()
        if age > settings.CONSOLE_BEAT_STALE_SECONDS[1]:
            raise ServiceUnavailable(f"Celery beat's last tick was {int(age)} s ago")


@dataclasses.dataclass
class Redis(HealthCheck):
    """PING to the Celery broker's Redis with the process's client (console.beat), kept
    between runs: the library's Redis check made a client for each run and closed it."""

    def run(self) -> None:
        from console.beat import redis_client

        try:
            redis_client(settings.CELERY_BROKER_URL).ping()
        except (redis.RedisError, OSError) as error:
            raise ServiceUnavailable("Redis unreachable") from error


HEALTH_CHECKS = (
    "health_check.checks.Database",
    "console.health.Kafka",
    "console.health.Redis",
    ("health_check.contrib.celery.Ping", {"timeout": datetime.timedelta(seconds=2)}),
    "console.health.CeleryBeat",
)

_run_health_checks = HealthCheckView.as_view(checks=HEALTH_CHECKS)


@dataclasses.dataclass(frozen=True)
class _HealthAnswer:
    until: float
    status: int
    content: bytes
    content_type: str


# The last answer per format asked for (?format=, Accept), kept HEALTH_CACHE_SECONDS.
HEALTH_ANSWERS_KEPT = 16
_health_answers: dict[tuple[str, str], _HealthAnswer] = {}


async def health_view(request: HttpRequest) -> HttpResponse:
    """/health/ (django-health-check's view), behind HEALTH_TOKEN, answering from its last
    run of the checks for HEALTH_CACHE_SECONDS."""
    refusal = monitoring_access_refusal(request, setting="HEALTH_TOKEN")
    if refusal is not None:
        return refusal
    asked = (request.GET.get("format", ""), request.headers.get("Accept", ""))
    answer = _health_answers.get(asked)
    if answer is None or answer.until <= time.monotonic():
        response = await _run_health_checks(request)
        if isinstance(response, SimpleTemplateResponse):
            response.render()
        answer = _HealthAnswer(
            until=time.monotonic() + settings.HEALTH_CACHE_SECONDS,
            status=response.status_code,
            content=response.content,
            content_type=response["Content-Type"],
        )
        if len(_health_answers) >= HEALTH_ANSWERS_KEPT:
            _health_answers.clear()  # odd Accept headers do not grow it without bound
        _health_answers[asked] = answer
    cached = HttpResponse(answer.content, status=answer.status, content_type=answer.content_type)
    add_never_cache_headers(cached)
    return cached
