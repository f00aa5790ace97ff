"""Switches a database from the claim relay to the event-log relay."""

from typing import Any

from django.core.management.base import BaseCommand

from outbox.services.event_log import event_log_take_over


class Command(BaseCommand):
    help = (
        "Hands every event the claim relay has not delivered to the event-log relay and starts "
        "its cursors now. Stop every claim relay (outbox_relay without --log, and beat's "
        "outbox.tasks.relay unless OUTBOX_RELAY_LOG is set) first: one still running would "
        "send the same events."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        taken = event_log_take_over()
        self.stdout.write(
            f"the event-log relay starts at tick {taken['tick']} and holds "
            f"{taken['events']} undelivered events, each key's in order"
        )
