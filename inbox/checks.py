"""Checks of the inbox settings: Django system checks (the shape of INBOX and KAFKA_EVENTS,
kafka_events/conf.py: inbox.E010 unknown key, E011 wrong type, E012 not a dict; then their
values), and the retention of the consumed topics, which only a Kafka client can read
(inbox_consume checks them at start).

The DONE row is what recognises a redelivery, so INBOX["RETENTION_DAYS"] must cover the longest
time after which Kafka can deliver a record again (an offset reset, a lost offset commit, a
replay): the topic's retention.ms plus its segment.ms, because Kafka deletes whole segments,
once the newest record of a segment is older than retention.ms, and a segment takes records
for up to segment.ms. With Kafka's defaults that is 7 + 7 = 14 days.
"""

from collections.abc import Sequence
from typing import Any

from confluent_kafka.admin import AdminClient, ConfigResource
from django.core.checks import CheckMessage, Error, Warning, register

from inbox.conf import inbox_settings
from inbox.config import CLASSIC_ONLY_CONFIG, GROUP_PROTOCOLS
from kafka_events.conf import check_kafka_events_settings
from kafka_events.kafka import kafka_connection_config

register(check_kafka_events_settings)

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
    messages = inbox_settings.check()
    if messages:
        # The checks below compare values: they need the types right first.
        return messages
    name = inbox_settings.name
    if inbox_settings.UNKNOWN_EVENT_TYPE not in ("ignore", "fail"):
        messages.append(
            Error(
                f"{name('UNKNOWN_EVENT_TYPE')} is {inbox_settings.UNKNOWN_EVENT_TYPE!r}.",
                hint="Set it to 'ignore' or 'fail'.",
                id="inbox.E001",
            )
        )
    if inbox_settings.BATCH_MAX_SECONDS * 1000 >= inbox_settings.MAX_POLL_INTERVAL_MS:
        messages.append(
            Error(
                f"{name('BATCH_MAX_SECONDS')} is not below max.poll.interval.ms: a slow batch "
                "would get the consumer dropped from its group.",
                hint=f"Lower {name('BATCH_MAX_SECONDS')} or raise {name('MAX_POLL_INTERVAL_MS')}.",
                id="inbox.E002",
            )
        )
    orderings = {name("ORDERING"): inbox_settings.ORDERING} | {
        f"{name('GROUP_ORDERING')}[{group!r}]": ordering
        for group, ordering in inbox_settings.GROUP_ORDERING.items()
    }
    for setting, ordering in orderings.items():
        if ordering not in ("key", "none"):
            messages.append(
                Error(
                    f"{setting} is {ordering!r}.",
                    hint="Set it to 'key' (order per key) or 'none'.",
                    id="inbox.E003",
                )
            )
    messages += _group_protocol_errors()
    window = KAFKA_DEFAULT_RETENTION_MS + KAFKA_DEFAULT_SEGMENT_MS
    if window > inbox_settings.RETENTION_DAYS * MS_PER_DAY:
        messages.append(
            Warning(
                f"{name('RETENTION_DAYS')} ({inbox_settings.RETENTION_DAYS}) is shorter than the "
                f"time Kafka can deliver a record again with its default topic settings "
                f"({_days(window)}: retention.ms plus segment.ms): a record read again after "
                "its DONE row was purged would run its handler a second time.",
                hint=(
                    f"Keep {name('RETENTION_DAYS')} at least retention.ms + segment.ms of the "
                    "topics the inbox consumes; inbox_consume checks the real topics at start."
                ),
                id="inbox.W001",
            )
        )
    return messages


def _group_protocol_errors() -> list[CheckMessage]:
    protocol = inbox_settings.GROUP_PROTOCOL
    if protocol not in GROUP_PROTOCOLS:
        return [
            Error(
                f"{inbox_settings.name('GROUP_PROTOCOL')} is {protocol!r}.",
                hint="Set it to 'classic' or 'consumer' (KIP-848, Kafka 4).",
                id="inbox.E004",
            )
        ]
    if protocol != "consumer":
        return []
    return [
        Error(
            f"{inbox_settings.name('CONSUMER_CONFIG')} sets {property_name}, which librdkafka "
            f'refuses with {inbox_settings.name("GROUP_PROTOCOL")} "consumer".',
            hint=f"Remove it; its replacement is {replacement}.",
            id="inbox.E005",
        )
        for property_name, replacement in CLASSIC_ONLY_CONFIG.items()
        if property_name in inbox_settings.CONSUMER_CONFIG
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
    inbox_retention_ms = inbox_settings.RETENTION_DAYS * MS_PER_DAY
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
                f"plus segment.ms), longer than {inbox_settings.name('RETENTION_DAYS')} "
                f"({inbox_settings.RETENTION_DAYS} days): a record read again after its DONE "
                f"row was purged would run its handler a second time. Raise "
                f"{inbox_settings.name('RETENTION_DAYS')}, or lower the topic's retention."
            )
    return warnings
