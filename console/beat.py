"""Celery beat's heartbeat. Beat runs this scheduler (CELERY_BEAT_SCHEDULER): django-celery-beat's
DatabaseScheduler, whose every tick also writes the time to Redis (the broker beat talks to
anyway), at most once a second. The dashboard and /health/ read it.

django-celery-beat's own PeriodicTask.last_run_at is written only when its scheduler syncs,
every few minutes: read as a heartbeat, it said "never ticked" long after beat started."""

import functools
import logging
import time
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django_celery_beat.schedulers import DatabaseScheduler

logger = logging.getLogger(__name__)

HEARTBEAT_KEY = "console:beat:heartbeat"
# A heartbeat older than this is gone: beat stopped a day ago reads as never having ticked.
HEARTBEAT_TTL_SECONDS = 86_400
HEARTBEAT_MIN_INTERVAL_SECONDS = 1.0


REDIS_TIMEOUT_SECONDS = 1


@functools.cache
def redis_client(url: str) -> redis.Redis:
    """The process's client of the Redis at `url` (the heartbeat's, and /health/'s PING):
    its pool keeps a connection between calls, where a client per call connected each time.
    redis-py drops a connection a command failed on and connects again for the next (so a
    restarted Redis is read again without a new client), and starts the pool afresh in a
    forked child."""
    return redis.Redis.from_url(
        url, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS
    )


def beat_heartbeat_record(moment: float | None = None) -> None:
    """Writes that beat ticked at `moment` (seconds since the epoch; now by default)."""
    redis_client(settings.CELERY_BROKER_URL).set(
        HEARTBEAT_KEY, repr(time.time() if moment is None else moment), ex=HEARTBEAT_TTL_SECONDS
    )


def beat_last_tick() -> datetime | None:
    """When beat last ticked, or None if it has not (in the heartbeat's lifetime). Raises
    redis.RedisError when Redis cannot be read."""
    value = redis_client(settings.CELERY_BROKER_URL).get(HEARTBEAT_KEY)
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


class HeartbeatScheduler(DatabaseScheduler):
    """django-celery-beat's scheduler, with a heartbeat on each tick."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_heartbeat = 0.0

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval: float = super().tick(*args, **kwargs)
        now = time.monotonic()
        if now - self._last_heartbeat >= HEARTBEAT_MIN_INTERVAL_SECONDS:
            try:
                beat_heartbeat_record()
                self._last_heartbeat = now
            except (redis.RedisError, OSError) as error:
                # Beat goes on scheduling; the dashboard shows the heartbeat ageing.
                logger.warning("Beat's heartbeat was not written: %s", error)
        return interval
