import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scenarios.checker import delivery_check


class Command(BaseCommand):
    help = (
        "Compares a topic's outbox rows, its whole Kafka log (read_committed) and the inbox and "
        "scenario effects of the given groups: lost events, duplicate effects, duplicates in "
        "the log, order inversions per key, rows stuck. Exits 1 when a promise is broken."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--topic", required=True)
        parser.add_argument(
            "--group",
            action="append",
            dest="groups",
            required=True,
            help="A consumer group that should have applied every event (repeatable).",
        )
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        report = delivery_check(topic=options["topic"], groups=options["groups"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2, default=str))
        else:
            self.stdout.write(report.format())
        if not report.ok:
            raise CommandError("; ".join(report.problems()), returncode=1)
