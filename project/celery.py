import os
from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")

app = Celery("project")
# Every CELERY_* setting in project/settings/celery.py configures this app.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
@beat_init.connect
def _configure_tracing(**kwargs: Any) -> None:
    # In the worker's (or beat's) main process, not at import: every process that imports
    # Django imports this app. A prefork child inherits the provider; the SDK restarts its
    # batch span processor's thread after the fork.
    from kafka_events.tracing import configure_tracing

    configure_tracing(service_name="celery")
