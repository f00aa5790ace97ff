"""Every periodic task, in one place. django-celery-beat's DatabaseScheduler copies these
entries into its tables, where the admin can pause them. The outbox's and the inbox's entries
come from the package's helpers, as in any project that uses it; the analytics run and the
reapers (of analytics runs and of bulk operations whose worker died) are this project's own."""

from inbox.beat import inbox_beat_schedule
from outbox.beat import outbox_beat_schedule
from project.settings.analytics import (
    ANALYTICS_INTERVAL_SECONDS,
    ANALYTICS_RUN_REAP_INTERVAL_SECONDS,
)
from project.settings.inbox import INBOX
from project.settings.outbox import OUTBOX

# How often a bulk operation left RUNNING by a dead worker is looked for: it waits at most this
# long before it resumes.
BULK_REAP_INTERVAL_SECONDS = 60.0

CELERY_BEAT_SCHEDULE = {
    **outbox_beat_schedule(OUTBOX),
    **inbox_beat_schedule(INBOX),
    "analytics-run": {
        "task": "analytics.tasks.run_analytics",
        "schedule": ANALYTICS_INTERVAL_SECONDS,
    },
    "analytics-reap-runs": {
        "task": "analytics.tasks.reap_runs",
        "schedule": ANALYTICS_RUN_REAP_INTERVAL_SECONDS,
    },
    # The console's: bulk operations whose worker died are resumed (or failed).
    "console-reap-bulk-operations": {
        "task": "console.reap_bulk_operations",
        "schedule": BULK_REAP_INTERVAL_SECONDS,
    },
}
