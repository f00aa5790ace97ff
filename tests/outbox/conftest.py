import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, Message
from django.conf import settings
from django.db import connection, transaction

import outbox
from kafka_events.conf import kafka_settings
from outbox.log_relay import LogRelay
from outbox.models import OutboxEvent
from outbox.producer import close_producers


@pytest.fixture(autouse=True)
def _fresh_producers() -> Iterator[None]:
    # A test that changes the producer's settings must not inherit another test's producer.
    close_producers()
    yield
    close_producers()


@pytest.fixture
def log_relay() -> Iterator[Callable[..., LogRelay]]:
    """Makes event-log relays and gives up their shards after the test: the advisory locks
    belong to the database session, which outlives the test."""
    made: list[LogRelay] = []

    def make(**options: object) -> LogRelay:
        relay = LogRelay(**options)  # type: ignore[arg-type]
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.close()


def publish_events(topic: str, count: int, *, keys: int = 10, start: int = 0) -> list[OutboxEvent]:
    """Publishes count events in one committed transaction, numbered per key in payload['seq']."""
    with transaction.atomic():
        return [
            outbox.publish(
                aggregate_type="order",
                aggregate_id=f"order-{number % keys}",
                event_type="OrderPlaced",
                payload={"number": number, "seq": number // keys},
                topic=topic,
            )
            for number in range(start, start + count)
        ]


@pytest.fixture
def without_sequential_scans() -> Iterator[None]:
    """This session's reads go through indexes, as on a production-sized table: on a test's
    small one the planner may read a whole partition instead, which says nothing of how far
    an index range would walk."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
    yield
    with connection.cursor() as cursor:
        cursor.execute("RESET enable_seqscan")


def event_rows_read() -> int:
    """Rows and index entries this database's sessions have read from the event table's
    partitions (a sequential scan counts each row it reads), this session's counts flushed
    first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            """
            WITH partition AS (
                SELECT relid FROM pg_partition_tree('outbox_event'::regclass)
            )
            SELECT (SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables
                    WHERE relid IN (SELECT relid FROM partition))
                 + (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
                    WHERE relid IN (SELECT relid FROM partition))
            """
        )
        return int(cursor.fetchone()[0])


def consume_all(
    consumer_config: dict, topic: str, *, expected: int, timeout: float = 60.0
) -> list[Message]:
    """Reads the topic from the start until `expected` records arrived and the log is quiet."""
    consumer = Consumer({**consumer_config, "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    quiet_since = None
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, timeout=0.5)
            batch = [m for m in batch if m.error() is None]
            messages.extend(batch)
            if len(messages) >= expected:
                # Keep reading briefly: more than expected would be a duplicate.
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 1.5:
                    break
    finally:
        consumer.close()
    return messages


def headers_of(message: Message) -> dict[str, str]:
    headers: list[tuple[str, bytes]] = message.headers() or []  # type: ignore[assignment]
    return {name: value.decode() for name, value in headers}


def payload_of(message: Message) -> dict:
    return json.loads(message.value() or b"null")


def assert_order_per_key(messages: list[Message]) -> None:
    by_key: dict[bytes | str | None, list[int]] = defaultdict(list)
    for message in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        by_key[message.key()].append(payload_of(message)["seq"])
    for key, sequence in by_key.items():
        assert sequence == sorted(sequence), f"order broken for key {key!r}: {sequence}"


def subprocess_environment(**extra: str) -> dict[str, str]:
    """The environment for a manage.py subprocess that works on this test's database."""
    database = connection.settings_dict
    url = (
        f"postgres://{database['USER']}:{database['PASSWORD']}@{database['HOST']}:"
        f"{database['PORT'] or 5432}/{database['NAME']}"
    )
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings.local",
        "DATABASE_URL": url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.BOOTSTRAP_SERVERS,
        "OUTBOX_NUDGE_ON_COMMIT": "false",
        **extra,
    }


@pytest.fixture
def start_relay() -> Iterator[Callable[..., subprocess.Popen]]:
    started: list[subprocess.Popen] = []

    def start(*arguments: str, **environment: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "outbox_relay", "--poll-seconds", "0.2", *arguments],
            cwd=settings.BASE_DIR,
            env=subprocess_environment(**environment),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def wait_until(condition: Callable[[], bool], *, timeout: float = 60.0, message: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {message or condition}")
