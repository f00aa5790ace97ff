"""Every periodic task, in one place. django-celery-beat's DatabaseScheduler copies these
entries into its tables, where the admin can pause them."""

from project.settings.analytics import ANALYTICS_INTERVAL_SECONDS
from project.settings.inbox import INBOX_RETRY_INTERVAL
from project.settings.outbox import OUTBOX_RELAY_INTERVAL

CELERY_BEAT_SCHEDULE = {
    # A tick still queued after a few intervals (every worker busy) is dropped rather than run
    # late: a newer tick does the same work, and stale ones would pile up behind it.
    "outbox-relay": {
        "task": "outbox.tasks.relay",
        "schedule": OUTBOX_RELAY_INTERVAL,
        "options": {"expires": max(5.0, 3 * OUTBOX_RELAY_INTERVAL)},
    },
    "outbox-purge-published": {"task": "outbox.tasks.purge_published", "schedule": 3600.0},
    "inbox-retry-due": {"task": "inbox.tasks.retry_due", "schedule": INBOX_RETRY_INTERVAL},
    "inbox-purge-processed": {"task": "inbox.tasks.purge_processed", "schedule": 3600.0},
    "analytics-run": {
        "task": "analytics.tasks.run_analytics",
        "schedule": ANALYTICS_INTERVAL_SECONDS,
    },
}
