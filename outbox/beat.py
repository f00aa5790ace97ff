"""The periodic tasks the outbox needs, as entries of a Celery beat schedule.

In the project's settings, after its OUTBOX dict:

    from inbox.beat import inbox_beat_schedule
    from outbox.beat import outbox_beat_schedule

    CELERY_BEAT_SCHEDULE = {**outbox_beat_schedule(OUTBOX), **inbox_beat_schedule(INBOX)}

Settings modules run before Django has settings, so the dict is passed in rather than read
through `outbox_settings`; a key it leaves out takes its default from outbox/conf.py. The task
names are stable: a renamed task would leave beat's stored entries pointing at nothing.
"""

from collections.abc import Mapping
from typing import Any

from outbox.conf import DEFAULTS

RELAY_TASK = "outbox.tasks.relay"
PURGE_PUBLISHED_TASK = "outbox.tasks.purge_published"
# Retention drops whole day partitions and creates the days ahead (two); hourly leaves a day
# of runs to fail before a row would land in the DEFAULT partition.
PURGE_INTERVAL_SECONDS = 3600.0
# A relay tick still queued after this many intervals (every worker busy) is dropped rather
# than run late: a newer tick does the same work, and stale ones would pile up behind it.
RELAY_EXPIRES_INTERVALS = 3
RELAY_EXPIRES_MIN_SECONDS = 5.0


def outbox_beat_schedule(outbox: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Beat entries for the relay (every OUTBOX["RELAY_INTERVAL"] seconds) and for retention
    with partition maintenance (hourly), keyed "outbox-relay" and "outbox-purge-published"."""
    relay_interval = float((outbox or {}).get("RELAY_INTERVAL", DEFAULTS["RELAY_INTERVAL"]))
    return {
        "outbox-relay": {
            "task": RELAY_TASK,
            "schedule": relay_interval,
            "options": {
                "expires": max(RELAY_EXPIRES_MIN_SECONDS, RELAY_EXPIRES_INTERVALS * relay_interval)
            },
        },
        "outbox-purge-published": {
            "task": PURGE_PUBLISHED_TASK,
            "schedule": PURGE_INTERVAL_SECONDS,
        },
    }
