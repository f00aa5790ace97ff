from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from analytics.errors import AnalyticsError
from analytics.models import AnalyticsRun
from analytics.services import analytics_run_execute, analytics_window_default


def _parse(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    parsed = parse_datetime(value)
    if parsed is None:
        raise CommandError(f"--{name} {value!r} is not an ISO 8601 date-time (2026-01-31T10:00Z).")
    if parsed.tzinfo is None:
        raise CommandError(f"--{name} {value!r} needs a time zone, e.g. {value}Z for UTC.")
    return parsed


class Command(BaseCommand):
    help = (
        "Runs the analytics job (lag, duplicates, reconciliation) on the outbox events created "
        "in [--since, --until). Without them: the last full interval the SLA has closed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", help="window start, ISO 8601 with a time zone")
        parser.add_argument("--until", help="window end (exclusive), ISO 8601 with a time zone")
        parser.add_argument(
            "--no-kafka-scan",
            action="store_true",
            help="skip the scan of the Kafka log (re-sent and missing events)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        default_since, default_until = analytics_window_default()
        until = _parse(options["until"], "until") or default_until
        since = _parse(options["since"], "since")
        if since is None:
            since = until - (default_until - default_since)
        try:
            run = analytics_run_execute(
                since=since,
                until=until,
                trigger=AnalyticsRun.Trigger.COMMAND,
                kafka_scan=False if options["no_kafka_scan"] else None,
            )
        except AnalyticsError as error:
            raise CommandError(str(error)) from error
        self.stdout.write(
            f"run {run.pk} {run.status}: window {run.window_start.isoformat()} - "
            f"{run.window_end.isoformat()}, {run.rows_read} rows read "
            f"(outbox {run.outbox_rows}, inbox {run.inbox_rows}, kafka {run.kafka_records}), "
            f"{run.findings} finding(s), {run.duration_seconds or 0:.1f} s"
        )
        if run.status == AnalyticsRun.Status.FAILED:
            raise CommandError(f"run {run.pk} failed: {run.error}")
