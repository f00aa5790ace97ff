from celery import shared_task

from analytics.models import AnalyticsRun
from analytics.services import analytics_run_scheduled


@shared_task(name="analytics.tasks.run_analytics")
def run_analytics(trigger: str = AnalyticsRun.Trigger.BEAT) -> int:
    """Runs the job on the last closed interval; returns the run's id. A failed job is a
    FAILED run with its reason, not a task error: the next tick runs the next window."""
    return analytics_run_scheduled(trigger=trigger).pk
