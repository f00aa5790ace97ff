"""System checks of the inbox settings."""

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

SECONDS_PER_DAY = 86_400


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
    if settings.INBOX_RETENTION_DAYS * SECONDS_PER_DAY <= settings.INBOX_RETRY_MAX_SECONDS:
        messages.append(
            Warning(
                "INBOX_RETENTION_DAYS is shorter than one retry delay; rows would be purged "
                "while redeliveries can still arrive.",
                hint="Keep INBOX_RETENTION_DAYS above the topics' retention (7 days by default).",
                id="inbox.W001",
            )
        )
    return messages
