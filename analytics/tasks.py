from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils.dateparse import parse_datetime

from analytics.models import AnalyticsRun
from analytics.services import analytics_run_scheduled, analytics_runs_reap


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


@shared_task(name="analytics.tasks.reap_runs", ignore_result=True)
def reap_runs() -> int:
    """Marks FAILED the runs whose worker stopped (no heartbeat for
    ANALYTICS_RUN_STALE_SECONDS); returns how many."""
    stale_after = timedelta(seconds=settings.ANALYTICS_RUN_STALE_SECONDS)
    return len(analytics_runs_reap(stale_after=stale_after))
