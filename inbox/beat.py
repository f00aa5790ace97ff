"""The periodic tasks the inbox needs, as entries of a Celery beat schedule.

In the project's settings, after its OUTBOX and INBOX dicts:

    from inbox.beat import inbox_beat_schedule
    from outbox.beat import outbox_beat_schedule

    CELERY_BEAT_SCHEDULE = {**outbox_beat_schedule(OUTBOX), **inbox_beat_schedule(INBOX)}

Settings modules run before Django has settings, so the dict is passed in rather than read
through `inbox_settings`; a key it leaves out takes its default from inbox/conf.py. The task
names are stable: a renamed task would leave beat's stored entries pointing at nothing.
"""

from collections.abc import Mapping
from typing import Any

from inbox.conf import DEFAULTS

RETRY_DUE_TASK = "inbox.tasks.retry_due"
PURGE_PROCESSED_TASK = "inbox.tasks.purge_processed"
# DONE rows live RETENTION_DAYS days: an hour more or less before their deletion is nothing.
PURGE_INTERVAL_SECONDS = 3600.0


def inbox_beat_schedule(inbox: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Beat entries for the retries of failed handlers (every INBOX["RETRY_INTERVAL"]
    seconds) and for retention (hourly), keyed "inbox-retry-due" and "inbox-purge-processed"."""
    retry_interval = float((inbox or {}).get("RETRY_INTERVAL", DEFAULTS["RETRY_INTERVAL"]))
    return {
        "inbox-retry-due": {"task": RETRY_DUE_TASK, "schedule": retry_interval},
        "inbox-purge-processed": {
            "task": PURGE_PROCESSED_TASK,
            "schedule": PURGE_INTERVAL_SECONDS,
        },
    }
