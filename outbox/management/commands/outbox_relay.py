"""A long-running relay woken by PostgreSQL LISTEN/NOTIFY: the lowest publish latency.

Each insert into the outbox notifies the `outbox_event` channel when its transaction
commits; the relay then sends what the log holds until nothing is left (checking for a stop
signal every --poll-seconds while a backlog drains), and otherwise wakes at least every
--poll-seconds for held events whose retry has come due."""

import contextlib
import logging
import signal
import socket
import time
from types import FrameType
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection

from kafka_events.tracing import configure_tracing
from outbox.log_relay import LogRelay
from outbox.producer import close_producers, get_producer
from outbox.relay import transactional_id_for
from outbox.services.event_log.shards import RelayNeedsItsSession
from outbox.services.nudge import NOTIFY_CHANNEL

logger = logging.getLogger(__name__)

# After losing the database, the relay waits this long before trying again, doubling up to
# the maximum.
DATABASE_RETRY_SECONDS = 0.5
DATABASE_RETRY_MAX_SECONDS = 10.0


class Command(BaseCommand):
    help = "Publishes outbox events to Kafka as soon as they commit (LISTEN/NOTIFY)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--slot",
            default=socket.gethostname(),
            help="Names this relay's transactional.id in transactional mode; give each "
            "concurrent relay its own slot, and a restarted relay its old one.",
        )
        parser.add_argument("--poll-seconds", type=float, default=1.0)
        parser.add_argument("--batch-size", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        configure_tracing(service_name="outbox-relay")
        self.running = True
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        relay = LogRelay(
            transactional_id=transactional_id_for(options["slot"]),
            batch_size=options["batch_size"],
        )
        if relay.transactional_id:
            # Initialising the transactional producer now fences a zombie with the same slot
            # before this relay reports itself ready.
            get_producer(transactional_id=relay.transactional_id)
        listener: psycopg.Connection[Any] | None = None
        published = 0
        backoff = DATABASE_RETRY_SECONDS
        try:
            while self.running:
                try:
                    if listener is None:
                        listener = self._listen()
                        self.stdout.write(
                            f"outbox relay {relay.relay_id} listening on '{NOTIFY_CHANNEL}'"
                        )
                        self.stdout.flush()
                    result = relay.run(max_seconds=options["poll_seconds"])
                    published += result.published
                    if result.drained:
                        # Otherwise the run stopped at its deadline with events still due
                        # (a backlog): go on at once rather than wait for a notification.
                        self._wait_for_notification(listener, options["poll_seconds"])
                    backoff = DATABASE_RETRY_SECONDS
                except RelayNeedsItsSession as error:
                    # A setting to change, not a failure to wait out.
                    raise CommandError(str(error)) from error
                except (DatabaseError, psycopg.Error) as error:
                    # PostgreSQL restarting or unreachable: the cursors stay where they are;
                    # keep trying rather than exit and need a supervisor.
                    logger.warning(
                        "Outbox relay lost the database (%s); retrying in %.1fs", error, backoff
                    )
                    connection.close()
                    if listener is not None:
                        listener.close()
                        listener = None
                    self._sleep(backoff)
                    backoff = min(backoff * 2, DATABASE_RETRY_MAX_SECONDS)
        finally:
            # If the session is gone, its shard locks went with it.
            with contextlib.suppress(DatabaseError, psycopg.Error):
                relay.close()
            close_producers()
            if listener is not None:
                listener.close()
            connection.close()
            self.stdout.write(f"outbox relay stopped after publishing {published} events")

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.running and time.monotonic() < deadline:
            time.sleep(min(0.1, seconds))

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.running = False

    def _listen(self) -> psycopg.Connection[Any]:
        # A connection of its own, in autocommit: LISTEN must not sit inside a transaction.
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("prepare_threshold", None)
        params.pop("server_side_binding", None)
        listener = psycopg.connect(**params, autocommit=True)
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        return listener

    def _wait_for_notification(self, listener: psycopg.Connection[Any], timeout: float) -> None:
        # Returns at the first notification (psycopg also serves ones it has already read
        # off the socket) or after the timeout; one wake-up then drains what is due.
        for _ in listener.notifies(timeout=timeout, stop_after=1):
            pass
