"""Checks of the inbox settings: Django system checks, and the retention of the consumed
topics, which only a Kafka client can read (inbox_consume checks them at start).

The DONE row is what recognises a redelivery, so INBOX_RETENTION_DAYS must cover the longest
time after which Kafka can deliver a record again (an offset reset, a lost offset commit, a
replay): the topic's retention.ms plus its segment.ms, because Kafka deletes whole segments,
once the newest record of a segment is older than retention.ms, and a segment takes records
for up to segment.ms. With Kafka's defaults that is 7 + 7 = 14 days.
"""

from collections.abc import Sequence
from typing import Any

from confluent_kafka.admin import AdminClient, ConfigResource
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from inbox.config import CLASSIC_ONLY_CONFIG, GROUP_PROTOCOLS
from kafka_events.kafka import kafka_connection_config

MS_PER_DAY = 86_400_000
# Kafka's defaults (log.retention.hours=168, log.roll.hours=168), assumed by the system check.
KAFKA_DEFAULT_RETENTION_MS = 7 * MS_PER_DAY
KAFKA_DEFAULT_SEGMENT_MS = 7 * MS_PER_DAY
TOPIC_CONFIG_TIMEOUT_SECONDS = 5.0


def redelivery_window_ms(*, retention_ms: int, segment_ms: int) -> int | None:
    """How long after it was written Kafka can still deliver a record; None: for ever."""
    if retention_ms < 0:
        return None
    return retention_ms + segment_ms


def _days(milliseconds: int) -> str:
    return f"{milliseconds / MS_PER_DAY:g} days"


@register()
def check_inbox_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    if settings.INBOX_UNKNOWN_EVENT_TYPE not in ("ignore", "fail"):
        messages.append(
            Error(
                f"INBOX_UNKNOWN_EVENT_TYPE is {settings.INBOX_UNKNOWN_EVENT_TYPE!r}.",
                hint="Set it to 'ignore' or 'fail'.",
                id="inbox.E001",
            )
        )
    if settings.INBOX_BATCH_MAX_SECONDS * 1000 >= settings.INBOX_MAX_POLL_INTERVAL_MS:
        messages.append(
            Error(
                "INBOX_BATCH_MAX_SECONDS is not below max.poll.interval.ms: a slow batch "
                "would get the consumer dropped from its group.",
                hint="Lower INBOX_BATCH_MAX_SECONDS or raise INBOX_MAX_POLL_INTERVAL_MS.",
                id="inbox.E002",
            )
        )
    orderings = {"INBOX_ORDERING": settings.INBOX_ORDERING} | {
        f"INBOX_GROUP_ORDERING[{group!r}]": ordering
        for group, ordering in settings.INBOX_GROUP_ORDERING.items()
    }
    for name, ordering in orderings.items():
        if ordering not in ("key", "none"):
            messages.append(
                Error(
                    f"{name} is {ordering!r}.",
                    hint="Set it to 'key' (order per key) or 'none'.",
                    id="inbox.E003",
                )
            )
    messages += _group_protocol_errors()
    window = KAFKA_DEFAULT_RETENTION_MS + KAFKA_DEFAULT_SEGMENT_MS
    if window > settings.INBOX_RETENTION_DAYS * MS_PER_DAY:
        messages.append(
            Warning(
                f"INBOX_RETENTION_DAYS ({settings.INBOX_RETENTION_DAYS}) is shorter than the "
                f"time Kafka can deliver a record again with its default topic settings "
                f"({_days(window)}: retention.ms plus segment.ms): a record read again after "
                "its DONE row was purged would run its handler a second time.",
                hint=(
                    "Keep INBOX_RETENTION_DAYS at least retention.ms + segment.ms of the topics "
                    "the inbox consumes; inbox_consume checks the real topics at start."
                ),
                id="inbox.W001",
            )
        )
    return messages


def _group_protocol_errors() -> list[CheckMessage]:
    protocol = settings.INBOX_GROUP_PROTOCOL
    if protocol not in GROUP_PROTOCOLS:
        return [
            Error(
                f"INBOX_GROUP_PROTOCOL is {protocol!r}.",
                hint="Set it to 'classic' or 'consumer' (KIP-848, Kafka 4).",
                id="inbox.E004",
            )
        ]
    if protocol != "consumer":
        return []
    return [
        Error(
            f"INBOX_CONSUMER_CONFIG sets {name}, which librdkafka refuses with "
            "INBOX_GROUP_PROTOCOL=consumer.",
            hint=f"Remove it; its replacement is {replacement}.",
            id="inbox.E005",
        )
        for name, replacement in CLASSIC_ONLY_CONFIG.items()
        if name in settings.INBOX_CONSUMER_CONFIG
    ]


def topic_retention_warnings(
    *, topics: Sequence[str], timeout: float = TOPIC_CONFIG_TIMEOUT_SECONDS
) -> list[str]:
    """One message per topic whose records Kafka can deliver again after the inbox purged
    their rows. Raises KafkaException when the broker cannot tell."""
    admin = AdminClient(kafka_connection_config())
    futures = admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in topics],
        request_timeout=timeout,
    )
    inbox_retention_ms = settings.INBOX_RETENTION_DAYS * MS_PER_DAY
    warnings = []
    for resource, future in futures.items():
        config = future.result(timeout=timeout)
        window = redelivery_window_ms(
            retention_ms=int(config["retention.ms"].value),
            segment_ms=int(config["segment.ms"].value),
        )
        if window is None or window > inbox_retention_ms:
            kept = "for ever" if window is None else f"for up to {_days(window)}"
            warnings.append(
                f"Topic {resource.name} can deliver a record again {kept} (retention.ms "
                "plus segment.ms), longer than INBOX_RETENTION_DAYS "
                f"({settings.INBOX_RETENTION_DAYS} days): a record read again after its DONE "
                "row was purged would run its handler a second time. Raise "
                "INBOX_RETENTION_DAYS, or lower the topic's retention."
            )
    return warnings
