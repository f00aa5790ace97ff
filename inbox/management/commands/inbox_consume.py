import logging
import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from prometheus_client import start_http_server

from inbox.checks import topic_retention_warnings
from inbox.consumer import InboxConsumer
from inbox.errors import NoHandlers
from inbox.registry import get_registry
from kafka_events.tracing import configure_tracing

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Consume Kafka records into the inbox for one consumer group and run its handlers. "
        "SIGTERM/SIGINT finish the batch in progress, commit its offsets and close."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--group", help="The consumer group whose handlers run.")
        parser.add_argument(
            "--topic",
            action="append",
            dest="topics",
            help="A topic to read (repeatable). Default: the topics of the group's handlers.",
        )
        parser.add_argument(
            "--list-groups",
            action="store_true",
            help="Print each group that has handlers, one per line, and exit.",
        )
        parser.add_argument("--batch-size", type=int, help='Default: INBOX["BATCH_SIZE"].')
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=0,
            help="Serve Prometheus metrics on this port (0: do not serve).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        registry = get_registry()
        if options["list_groups"]:
            for group in registry.groups():
                self.stdout.write(group)
            return
        if not options["group"]:
            raise CommandError("Give --group (or --list-groups).")
        try:
            consumer = InboxConsumer(
                group=options["group"],
                topics=options["topics"],
                registry=registry,
                batch_size=options["batch_size"],
            )
        except NoHandlers as error:
            raise CommandError(str(error)) from error
        configure_tracing(service_name="inbox-consumer")

        self._check_topic_retention(consumer.topics)

        def stop(signum: int, frame: FrameType | None) -> None:
            consumer.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if options["metrics_port"]:
            start_http_server(options["metrics_port"])
        consumer.run()
        self.stdout.write(f"Inbox consumer for group {options['group']} stopped.")

    def _check_topic_retention(self, topics: list[str]) -> None:
        try:
            warnings = topic_retention_warnings(topics=topics)
        except Exception as error:  # advice only: the consumer starts all the same
            logger.warning("Could not read the retention of %s: %s", ", ".join(topics), error)
            return
        for warning in warnings:
            logger.warning(warning)
