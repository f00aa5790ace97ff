"""Every periodic task, in one place. django-celery-beat's DatabaseScheduler copies these
entries into its tables, where the admin can pause them."""

from project.settings.analytics import ANALYTICS_INTERVAL_SECONDS
from project.settings.inbox import INBOX
from project.settings.outbox import OUTBOX

# The intervals of OUTBOX["RELAY_INTERVAL"] and INBOX["RETRY_INTERVAL"]; when the dicts leave
# them out, the apps' defaults, repeated here because the settings import no app
# (tests/project/test_settings.py holds them in step with outbox/conf.py and inbox/conf.py).
_relay_interval: float = OUTBOX.get("RELAY_INTERVAL", 1.0)
_retry_interval: float = INBOX.get("RETRY_INTERVAL", 5.0)

CELERY_BEAT_SCHEDULE = {
    # A tick still queued after a few intervals (every worker busy) is dropped rather than run
    # late: a newer tick does the same work, and stale ones would pile up behind it.
    "outbox-relay": {
        "task": "outbox.tasks.relay",
        "schedule": _relay_interval,
        "options": {"expires": max(5.0, 3 * _relay_interval)},
    },
    "outbox-purge-published": {"task": "outbox.tasks.purge_published", "schedule": 3600.0},
    "inbox-retry-due": {"task": "inbox.tasks.retry_due", "schedule": _retry_interval},
    "inbox-purge-processed": {"task": "inbox.tasks.purge_processed", "schedule": 3600.0},
    "analytics-run": {
        "task": "analytics.tasks.run_analytics",
        "schedule": ANALYTICS_INTERVAL_SECONDS,
    },
}
