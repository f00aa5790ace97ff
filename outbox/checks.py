"""System checks: the shape of OUTBOX and KAFKA_EVENTS (kafka_events/conf.py: outbox.E010
unknown key, E011 wrong type, E012 not a dict; kafka_events.E010 to E012 alike), then settings
that would silently break the outbox's guarantees (E007: a producer property the relay sets
itself, given in PRODUCER_CONFIG; E008: a partitioner that ignores the key)."""

from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from kafka_events.conf import check_kafka_events_settings
from outbox.conf import outbox_settings
from outbox.producer import KEY_PARTITIONERS, RELAY_OWNED_PRODUCER_CONFIG
from outbox.services.nudge import NUDGE_REDIS_SCHEMES, nudge_redis_url

register(check_kafka_events_settings)

# Each must be at least 1: the key and the check's id.
POSITIVE = {
    "MAX_ATTEMPTS": "outbox.E002",
    "BATCH_SIZE": "outbox.E003",
    "MAX_PAYLOAD_BYTES": "outbox.E004",
    "BATCH_MAX_BYTES": "outbox.E009",
}


@register()
def check_outbox_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors = outbox_settings.check()
    if errors:
        # The checks below compare values: they need the types right first.
        return errors
    name = outbox_settings.name
    for key, check_id in POSITIVE.items():
        if getattr(outbox_settings, key) < 1:
            errors.append(Error(f"{name(key)} must be at least 1.", id=check_id))
    interval = outbox_settings.RELAY_INTERVAL
    if interval < 1 or interval != int(interval):
        errors.append(
            Error(
                f"{name('RELAY_INTERVAL')} must be a whole number of seconds, at least 1; got "
                f"{interval}.",
                hint="django-celery-beat stores intervals in whole seconds. For lower latency "
                "run `manage.py outbox_relay`, woken by each commit.",
                id="outbox.E005",
            )
        )
    for key in outbox_settings.PRODUCER_CONFIG:
        if key in RELAY_OWNED_PRODUCER_CONFIG:
            errors.append(
                Error(
                    f'{name("PRODUCER_CONFIG")} sets "{key}", which the relay sets itself.',
                    hint=RELAY_OWNED_PRODUCER_CONFIG[key],
                    id="outbox.E007",
                )
            )
    partitioner = outbox_settings.PRODUCER_CONFIG.get("partitioner")
    if partitioner is not None and partitioner not in KEY_PARTITIONERS:
        errors.append(
            Error(
                f'{name("PRODUCER_CONFIG")} sets "partitioner" to {partitioner!r}, which does '
                "not place an event by its key: a key's events would spread over partitions "
                "and lose their order.",
                hint=f"Remove it, or name one of {', '.join(sorted(KEY_PARTITIONERS))} "
                "(murmur2_random places keys as Java producers do).",
                id="outbox.E008",
            )
        )
    url = outbox_settings.NUDGE_REDIS_URL
    if url is not None and not url.startswith(NUDGE_REDIS_SCHEMES):
        errors.append(
            Error(
                f"{name('NUDGE_REDIS_URL')} is {url!r}, not a Redis URL.",
                hint="Give a redis://, rediss:// or unix:// URL, or None for the Redis of "
                "CELERY_BROKER_URL.",
                id="outbox.E006",
            )
        )
    elif (
        outbox_settings.NUDGE_ON_COMMIT
        and outbox_settings.NUDGE_MIN_INTERVAL_MS > 0
        and nudge_redis_url() is None
    ):
        errors.append(
            Warning(
                f"{name('NUDGE_MIN_INTERVAL_MS')} is counted in each process alone: no Redis "
                f"counts it across processes ({name('NUDGE_REDIS_URL')} is None and "
                "CELERY_BROKER_URL is not a Redis URL). Each process nudges the relay at most "
                "once per interval; all of them together, more often.",
                hint=f"Set {name('NUDGE_REDIS_URL')} to a Redis, or {name('NUDGE_ON_COMMIT')} "
                "to False to leave the relay to beat or `manage.py outbox_relay`.",
                id="outbox.W001",
            )
        )
    return errors
