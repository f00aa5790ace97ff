from celery import shared_task
from django.utils.dateparse import parse_datetime

from analytics.models import AnalyticsRun
from analytics.services import analytics_run_scheduled


@shared_task(name="analytics.tasks.run_analytics")
def run_analytics(
    trigger: str = AnalyticsRun.Trigger.BEAT, since: str | None = None, until: str | None = None
) -> int:
    """Runs the job on [since, until) (ISO 8601), by default the last closed interval;
    returns the run's id. A failed job is a FAILED run with its reason, not a task error:
    the next tick runs the next window."""
    return analytics_run_scheduled(
        trigger=trigger,
        since=parse_datetime(since) if since else None,
        until=parse_datetime(until) if until else None,
    ).pk
