"""Result rows written directly, as a run of the job would leave them: the API and the
dashboard are tested without Spark."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)

RESULTS_START = datetime(2026, 3, 1, tzinfo=UTC)
STAGES = ("publish", "consume", "end_to_end")


def result_run(
    *,
    since: datetime = RESULTS_START,
    hours: int = 3,
    status: str = AnalyticsRun.Status.SUCCEEDED,
    scale: float = 1.0,
) -> AnalyticsRun:
    """A run over `hours` hours with lag rows for 2 topics x 2 groups per stage (p50 = hour
    index + 1 seconds times `scale`, p95 = 2 p50, p99 = 3 p50), duplicate rows (duplicate
    rate 1% and 3% per hour) and two findings."""
    run = AnalyticsRun.objects.create(
        window_start=since,
        window_end=since + timedelta(hours=hours),
        status=status,
        finished_at=since + timedelta(hours=hours, minutes=10),
        findings=2,
        summary={"stuck": 1, "not_consumed": 1},
    )
    for index in range(hours):
        hour = since + timedelta(hours=index)
        for topic in ("orders", "users"):
            for stage in STAGES:
                for group in [""] if stage == "publish" else ["billing", "audit"]:
                    # The users topic is twice as slow: the dashboard shows the worst group.
                    base = (index + 1) * scale * (2 if topic == "users" else 1)
                    DeliveryLagStat.objects.create(
                        run=run,
                        hour=hour,
                        topic=topic,
                        event_type=f"{topic}.created",
                        consumer_group=group,
                        stage=stage,
                        count=100,
                        p50=base,
                        p95=2 * base,
                        p99=3 * base,
                        max=4 * base,
                    )
            for group, duplicates in (("billing", 1), ("audit", 3)):
                DuplicateStat.objects.create(
                    run=run,
                    hour=hour,
                    topic=topic,
                    consumer_group=group,
                    deliveries=100,
                    unique_events=100 - duplicates,
                    duplicate_deliveries=duplicates,
                    duplicate_rate=duplicates / 100,
                    max_copies=2,
                )
            RelayStat.objects.create(
                run=run,
                hour=hour,
                topic=topic,
                events=100,
                published=99,
                pending=1,
                failed=0,
                retried=2,
                retry_rate=0.02,
                failure_rate=0.0,
                max_attempts=3,
            )
    for kind, group in (
        (ReconciliationFinding.Kind.STUCK, ""),
        (ReconciliationFinding.Kind.NOT_CONSUMED, "billing"),
    ):
        finding_create(run=run, kind=kind, consumer_group=group, created_at=since)
    return run


def finding_create(*, run: AnalyticsRun, **fields: Any) -> ReconciliationFinding:
    values: dict[str, Any] = {
        "kind": ReconciliationFinding.Kind.STUCK,
        "event_id": str(uuid.uuid4()),
        "topic": "orders",
        "event_type": "orders.created",
        "detail": "planted",
        **fields,
    }
    return ReconciliationFinding.objects.create(run=run, **values)
