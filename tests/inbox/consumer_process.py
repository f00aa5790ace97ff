"""Test-only: `inbox_consume` with test handlers, in a subprocess that crash tests kill.

    consumer_process.py --group G --topic T [--handler-sleep S] [--broken-commit-order]

The handler registered for event type "Effect" (and "OrderPlaced") inserts a row into
inbox_test_effect (and with --chain-topic publishes an outbox event in the same transaction).
--broken-commit-order commits offsets before the database transaction, the bug the crash
tests must catch.
"""

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.test")
django.setup()

from django.core.management import call_command  # noqa: E402

from inbox import handler  # noqa: E402
from inbox.consumer import InboxConsumer  # noqa: E402
from inbox.models import InboxMessage  # noqa: E402
from inbox.services.recording import BatchResult  # noqa: E402
from outbox import publish  # noqa: E402
from tests.inbox.conftest import record_effect  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--handler-sleep", type=float, default=0.0)
    parser.add_argument("--broken-commit-order", action="store_true")
    parser.add_argument(
        "--chain-topic", help="the handler also publishes a ShipmentRequested outbox event here"
    )
    args = parser.parse_args()

    def apply_effect(message: InboxMessage) -> None:
        if args.handler_sleep:
            time.sleep(args.handler_sleep)
        record_effect(group=message.consumer_group, event_id=message.event_id)
        if args.chain_topic:
            publish(
                aggregate_type="shipment",
                aggregate_id=message.event_id,
                event_type="ShipmentRequested",
                payload={"for": message.event_id},
                topic=args.chain_topic,
            )

    for event_type in ("Effect", "OrderPlaced"):
        handler(event_type=event_type, topic=args.topic, group=args.group)(apply_effect)

    if args.broken_commit_order:
        correct = InboxConsumer._record_and_commit

        def broken(self: InboxConsumer, messages: Sequence[Any]) -> BatchResult:
            self._commit_offsets(messages)  # the bug: offsets first, work second
            return correct(self, messages)

        InboxConsumer._record_and_commit = broken  # type: ignore[method-assign]

    call_command("inbox_consume", group=args.group, topics=[args.topic])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
