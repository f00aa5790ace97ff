"""System checks: settings that would silently break the outbox's guarantees."""

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register


@register()
def check_outbox_settings(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    if settings.OUTBOX_MAX_ATTEMPTS < 1:
        errors.append(Error("OUTBOX_MAX_ATTEMPTS must be at least 1.", id="outbox.E002"))
    if settings.OUTBOX_BATCH_SIZE < 1:
        errors.append(Error("OUTBOX_BATCH_SIZE must be at least 1.", id="outbox.E003"))
    if settings.OUTBOX_MAX_PAYLOAD_BYTES < 1:
        errors.append(Error("OUTBOX_MAX_PAYLOAD_BYTES must be at least 1.", id="outbox.E004"))
    interval = settings.OUTBOX_RELAY_INTERVAL
    if interval < 1 or interval != int(interval):
        errors.append(
            Error(
                f"OUTBOX_RELAY_INTERVAL must be a whole number of seconds, at least 1; got "
                f"{interval}.",
                hint="django-celery-beat stores intervals in whole seconds. For lower latency "
                "run `manage.py outbox_relay`, woken by each commit.",
                id="outbox.E005",
            )
        )
    return errors
