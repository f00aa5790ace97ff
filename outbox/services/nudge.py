"""The on-commit nudge: a transaction that published events wakes a relay through Celery,
at most once per OUTBOX["NUDGE_MIN_INTERVAL_MS"] across all processes (counted in Redis).
An operator's repair wakes the long-running relays too (relays_wake_on_commit)."""

import functools
import time

import redis
from django.conf import settings
from django.db import connection, transaction

from outbox.conf import outbox_settings

NUDGE_EXPIRES_SECONDS = 5.0
# The channel `manage.py outbox_relay` listens on; each insert into the event table notifies
# it (a trigger of migration 0001).
NOTIFY_CHANNEL = "outbox_event"
# The URLs redis-py connects to; Celery's Redis broker URLs are the first two.
NUDGE_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def nudge_relay_on_commit() -> None:
    # One nudge per transaction, however many events it publishes.
    if any(entry[1] is _send_relay_nudge for entry in connection.run_on_commit):
        return
    transaction.on_commit(_send_relay_nudge, robust=True)


def relays_wake_on_commit() -> None:
    """Wakes the relays when the caller's transaction commits (at once in autocommit), for an
    operator's repair that wrote no event row: the long-running ones by the channel they listen
    on, a Celery worker's by a nudge. Otherwise a replay, retry or release would wait for the
    next event, poll or beat."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])
    if outbox_settings.NUDGE_ON_COMMIT:
        nudge_relay_on_commit()


_last_nudge_at = 0.0


def _send_relay_nudge() -> None:
    from outbox.tasks import relay

    # At most one nudge per NUDGE_MIN_INTERVAL_MS: under load, a relay run started by
    # the previous nudge is still looping over the new events, and a flood of nudges would
    # only queue empty runs that take CPU from the work. A skipped nudge waits at most for
    # the next one or the next beat tick; the outbox table, not the nudge, is the source of
    # truth. Checked in this process first (free), then across all processes (Redis).
    global _last_nudge_at
    interval_ms = outbox_settings.NUDGE_MIN_INTERVAL_MS
    now = time.monotonic()
    if now - _last_nudge_at < interval_ms / 1000:
        return
    _last_nudge_at = now
    if not _take_shared_nudge_slot(interval_ms):
        return
    # A nudge still queued after NUDGE_EXPIRES_SECONDS is dropped: beat's tick has come since.
    relay.apply_async(ignore_result=True, retry=False, expires=NUDGE_EXPIRES_SECONDS)


def relay_nudge_key() -> str:
    # Per database: relays of other databases sharing the Redis are not held back.
    return f"outbox:relay-nudge:{connection.settings_dict['NAME']}"


@functools.cache
def _nudge_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def nudge_redis_url() -> str | None:
    """The Redis that counts the nudges of all processes: OUTBOX["NUDGE_REDIS_URL"], else
    CELERY_BROKER_URL when it is a Redis URL. None: none (a project whose broker is not Redis,
    or that sets no CELERY_BROKER_URL); then each process counts its own (check outbox.W001)."""
    url = outbox_settings.NUDGE_REDIS_URL
    if url is None:
        broker = getattr(settings, "CELERY_BROKER_URL", None)
        if isinstance(broker, str) and broker.startswith(("redis://", "rediss://")):
            return broker
        return None
    # Another URL is refused by check outbox.E006; a nudge must not fail publish() for it.
    return url if url.startswith(NUDGE_REDIS_SCHEMES) else None


def _take_shared_nudge_slot(interval_ms: int) -> bool:
    """True for the first caller in all processes within `interval_ms`. Without a Redis to
    count in, or with a Redis that does not answer, nudges are not held back beyond this
    process's own count (apply_async then reports the broker's state as it always did)."""
    url = nudge_redis_url()
    if interval_ms <= 0 or url is None:
        return True
    try:
        return bool(_nudge_redis(url).set(relay_nudge_key(), 1, nx=True, px=interval_ms))
    except redis.RedisError:
        return True
