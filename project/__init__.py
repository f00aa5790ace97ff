from kafka_events.process_metrics import configure_process_metrics

# Before any app creates its metrics: counters of every process must reach /metrics.
configure_process_metrics()

# The Celery app is imported here so that @shared_task binds to it whenever Django starts.
from project.celery import app as celery_app  # noqa: E402

__all__ = ("celery_app",)
