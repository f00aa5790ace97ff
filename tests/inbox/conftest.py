import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction

from inbox import handler
from inbox.consumer import InboxConsumer
from inbox.records import parse_record
from inbox.registry import HandlerRegistry, scoped_registry
from inbox.services.recording import inbox_message_record_batch

WAIT_TIMEOUT_SECONDS = 60
CONSUMER_SCRIPT = Path(__file__).with_name("consumer_process.py")

EFFECT_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS inbox_test_effect (
    id bigserial PRIMARY KEY,
    consumer_group text NOT NULL,
    event_id text NOT NULL,
    worker_pid integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


def wait_for(
    condition: Callable[[], Any], *, timeout: float = WAIT_TIMEOUT_SECONDS, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")


@pytest.fixture
def inbox_registry() -> Iterator[HandlerRegistry]:
    """An empty handler registry, active for this test only."""
    with scoped_registry() as registry:
        yield registry


def record_effect(*, group: str, event_id: str) -> None:
    """A handler's business effect: a row in a table with no unique key, so applying an
    event twice shows as two rows."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO inbox_test_effect (consumer_group, event_id, worker_pid) "
            "VALUES (%s, %s, %s)",
            [group, event_id, os.getpid()],
        )


def effect_counts(group: str) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT event_id, count(*) FROM inbox_test_effect WHERE consumer_group = %s "
            "GROUP BY event_id",
            [group],
        )
        return dict(cursor.fetchall())


def effect_workers(group: str) -> dict[int, int]:
    """Effects applied per process id."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT worker_pid, count(*) FROM inbox_test_effect WHERE consumer_group = %s "
            "GROUP BY worker_pid",
            [group],
        )
        return dict(cursor.fetchall())


@pytest.fixture
def effects(django_db_blocker: Any) -> None:
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(EFFECT_TABLE_SQL)


@pytest.fixture
def run_consumer() -> Iterator[Callable[..., InboxConsumer]]:
    """Starts in-process consumers; `consume_until(consumer, condition)` drives one."""
    started: list[InboxConsumer] = []

    def start(**kwargs: Any) -> InboxConsumer:
        kwargs.setdefault("poll_timeout", 0.2)
        consumer = InboxConsumer(**kwargs)
        consumer.start()
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        consumer.close()


def consume_until(
    consumer: InboxConsumer, condition: Callable[[], Any], *, timeout: float = WAIT_TIMEOUT_SECONDS
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s"
        consumer.poll_batch()


def consume_for(consumer: InboxConsumer, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        consumer.poll_batch()


class ConsumerProcess:
    """`tests/inbox/consumer_process.py` (inbox_consume with test handlers) in a subprocess."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._log_file = log.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, str(CONSUMER_SCRIPT), *args],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=settings.BASE_DIR,
        )

    def wait(self, timeout: float = WAIT_TIMEOUT_SECONDS) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        finally:
            self._log_file.flush()

    def terminate(self, timeout: float = WAIT_TIMEOUT_SECONDS) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")


@pytest.fixture
def consumer_process(tmp_path: Path) -> Iterator[Callable[..., ConsumerProcess]]:
    """Starts consumer subprocesses against this test's database; kills leftovers."""
    processes: list[ConsumerProcess] = []
    database = settings.DATABASES["default"]
    database_url = (
        f"postgres://{database['USER']}:{database['PASSWORD']}@{database['HOST']}:"
        f"{database['PORT'] or 5432}/{database['NAME']}"
    )

    def start(
        *,
        group: str,
        topic: str,
        extra_args: list[str] | None = None,
        **env: str,
    ) -> ConsumerProcess:
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings.test",
            "DATABASE_URL": database_url,
            "PYTHONPATH": str(settings.BASE_DIR),
            "INBOX_POLL_TIMEOUT_SECONDS": "0.2",
            **env,
        }
        if "INBOX_FAULT_INJECT" not in env:
            full_env.pop("INBOX_FAULT_INJECT", None)
        log = tmp_path / f"consumer-{len(processes)}.log"
        process = ConsumerProcess(
            ["--group", group, "--topic", topic, *(extra_args or [])], full_env, log
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()


# A consumer group for tests that record batches directly, with records built in memory.
GROUP = "svc"


def records(events, *, start=0, topic="t"):
    """Parsed records of `events` at consecutive offsets, as a consumer would get them."""
    return [parse_record(e.message(topic=topic, offset=start + i)) for i, e in enumerate(events)]


def record_batch(batch, **kwargs):
    with transaction.atomic():
        return inbox_message_record_batch(group=GROUP, records=batch, **kwargs)


@pytest.fixture
def applied(inbox_registry, effects):
    """A handler for OrderPlaced in GROUP that records an effect; raise_for fails some."""
    state = {"raise_for": set()}

    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def apply(message):
        record_effect(group=GROUP, event_id=message.event_id)
        if message.event_id in state["raise_for"]:
            raise ValueError(f"cannot apply {message.event_id}")

    return state
