"""Every periodic task, in one place. django-celery-beat's DatabaseScheduler copies these
entries into its tables, where the admin can pause them."""

from project.settings.outbox import OUTBOX_RELAY_INTERVAL

CELERY_BEAT_SCHEDULE = {
    "outbox-relay": {"task": "outbox.tasks.relay", "schedule": OUTBOX_RELAY_INTERVAL},
    "outbox-purge-published": {"task": "outbox.tasks.purge_published", "schedule": 3600.0},
}
