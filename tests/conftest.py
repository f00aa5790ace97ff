"""Fixtures shared by the whole suite. The services are real: `make test` starts
PostgreSQL, Redis and Apache Kafka before pytest runs."""

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic
from django.conf import settings
from django.db import connection

from kafka_events.conf import kafka_settings
from kafka_events.kafka import kafka_connection_config
from scenarios.secured_kafka import SecuredKafka, development_secured_kafka

KAFKA_TIMEOUT_SECONDS = 30
BROKER_LOG = Path(settings.BASE_DIR) / ".local" / "kafka" / "node-1" / "kafka.log"


def _kafka_version_from_broker_log() -> str:
    if BROKER_LOG.is_file():
        match = re.search(r"Kafka version: (\S+)", BROKER_LOG.read_text(errors="replace"))
        if match:
            return match.group(1)
    return "unknown (broker not started by scripts/services.sh)"


def connect_outside_django(database: dict[str, Any], **options: Any) -> psycopg.Connection:
    """A connection of its own to the database Django's settings_dict `database` names, for
    tests that need a second session."""
    return psycopg.connect(
        host=database["HOST"],
        port=database["PORT"] or 5432,
        user=database["USER"],
        password=database["PASSWORD"],
        dbname=database["NAME"],
        **options,
    )


# The ports scripts/services.sh gives PgBouncer in session mode and in transaction mode, in
# front of the database of DATABASE_URL (every database name).
SESSION_POOL_PORT = int(os.environ.get("PGBOUNCER_PORT", "6432"))
TRANSACTION_POOL_PORT = int(os.environ.get("PGBOUNCER_TRANSACTION_PORT", "6433"))


@contextmanager
def connected_through(port: int) -> Iterator[Any]:
    """Django's connection goes to the same database through the pooler at `port` meanwhile;
    yields the port it went to before. Then the pooler lets go of its server connections to
    the database, which the test run drops at its end."""
    settings_dict = connection.settings_dict
    direct = settings_dict["PORT"]
    connection.close()
    settings_dict["PORT"] = port
    try:
        yield direct
    finally:
        connection.close()
        settings_dict["PORT"] = direct
        with connect_outside_django(
            {**settings_dict, "PORT": port, "NAME": "pgbouncer"}, autocommit=True
        ) as console:
            # KILL pauses the database too: RESUME lets the next clients in.
            console.execute(f'KILL "{settings_dict["NAME"]}"')
            console.execute(f'RESUME "{settings_dict["NAME"]}"')


@pytest.fixture(autouse=True)
def _no_tracing_sdk_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # A command a test calls in this process (inbox_consume, outbox_relay) sets tracing up as
    # at a process start; an OTEL_TRACES_EXPORTER in the environment would install a global
    # SDK for the rest of the session. Tests that want spans give a provider of their own;
    # the processes a test starts are given their OTEL_* variables by the test.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")


@pytest.fixture(autouse=True)
def _event_log_afresh_for_transactional_tests(
    request: pytest.FixtureRequest, django_db_blocker: Any
) -> None:
    """A test whose writes are committed starts with the event log afresh, as on a new
    database: the flush after the previous one emptied the outbox but not the relay's ticks and
    cursors (tables without a model), so each such test starts from one tick and one cursor
    and what it reads of them is its own."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None or not marker.kwargs.get("transaction"):
        return
    from outbox.services.event_log.cursors import event_log_start_afresh

    with django_db_blocker.unblock():
        event_log_start_afresh()


# A record over the producer's message.max.bytes as size_limited_log_relay sets it.
TOO_LARGE = "x" * 5000


@pytest.fixture
def size_limited_log_relay(settings: Any) -> Iterator[Any]:
    """An event-log relay whose producer refuses records over 4,000 bytes (TOO_LARGE), with
    two attempts a minute apart: failed keys to hold, retry, discard and count."""
    from outbox.log_relay import LogRelay
    from outbox.producer import close_producers

    settings.OUTBOX = {
        **settings.OUTBOX,
        "MAX_ATTEMPTS": 2,
        "RETRY_BASE_SECONDS": 60,
        "PRODUCER_CONFIG": {"message.max.bytes": "4000"},
    }
    close_producers()
    relay = LogRelay()
    yield relay
    relay.close()
    close_producers()


def publish_numbered(topic: str, key: str, seq: int, *, too_large: bool = False) -> Any:
    """Publishes event number `seq` of `key`, TOO_LARGE for size_limited_log_relay if asked."""
    from django.db import transaction

    import outbox

    with transaction.atomic():
        return outbox.publish(
            aggregate_type="order",
            aggregate_id=key,
            event_type="E",
            payload={"seq": seq, "filler": TOO_LARGE if too_large else ""},
            topic=topic,
        )


def event_row_place(event: Any) -> dict[str, Any]:
    """Where an event's row is, as a held row keeps it (OutboxHeldEvent's event_transaction_id,
    event_position and event_created_at): the transaction id PostgreSQL gave it, its position
    and its creation time (the partition key)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT txid::text::bigint, position, created_at FROM outbox_event WHERE id = %s",
            [event.pk],
        )
        transaction_id, position, created_at = cursor.fetchone()
    return {
        "event_transaction_id": transaction_id,
        "event_position": position,
        "event_created_at": created_at,
    }


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    database = settings.DATABASES["default"]
    try:
        with connect_outside_django(database, connect_timeout=5) as connection:
            row = connection.execute("SHOW server_version").fetchone()
        lines.append(f"postgresql: {row[0] if row else '?'} at {database['HOST']}")
    except psycopg.Error as error:
        lines.append(f"postgresql: unreachable ({error})")
    try:
        info = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=5).info("server")
        lines.append(f"redis: {info['redis_version']} at {settings.CELERY_BROKER_URL}")
    except redis.RedisError as error:
        lines.append(f"redis: unreachable ({error})")
    try:
        # The client must outlive the future, or librdkafka destroys the request.
        admin = AdminClient(kafka_connection_config())
        cluster = admin.describe_cluster(request_timeout=10).result(timeout=10)
        lines.append(
            f"kafka: Apache Kafka {_kafka_version_from_broker_log()}, "
            f"cluster {cluster.cluster_id}, {len(cluster.nodes)} broker(s) "
            f"at {kafka_settings.BOOTSTRAP_SERVERS}"
        )
    except Exception as error:  # the header reports, the tests fail
        lines.append(f"kafka: unreachable ({error})")
    return lines


@pytest.fixture(scope="session")
def kafka_admin() -> AdminClient:
    admin = AdminClient(kafka_connection_config())
    try:
        admin.list_topics(timeout=KAFKA_TIMEOUT_SECONDS)
    except Exception as error:
        pytest.fail(
            f"Apache Kafka does not answer at {kafka_settings.BOOTSTRAP_SERVERS}: {error}. "
            "Run 'make services-up' (make test does it for you)."
        )
    return admin


TopicFactory = Callable[..., str]


@pytest.fixture
def kafka_topic(kafka_admin: AdminClient, request: pytest.FixtureRequest) -> Iterator[TopicFactory]:
    """Creates uniquely named topics for one test and deletes them afterwards.

    `kafka_topic()` returns the new topic's name; `kafka_topic(partitions=6)` sets its size.
    """
    created: list[str] = []
    test_name = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name)[:60].strip("-")

    def create(*, partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"test.{test_name}.{uuid.uuid4().hex[:10]}"
        futures = kafka_admin.create_topics(
            [NewTopic(name, num_partitions=partitions, config=config or {})],
            operation_timeout=KAFKA_TIMEOUT_SECONDS,
        )
        futures[name].result(timeout=KAFKA_TIMEOUT_SECONDS)
        created.append(name)
        return name

    yield create
    if created:
        for future in kafka_admin.delete_topics(created).values():
            future.result(timeout=KAFKA_TIMEOUT_SECONDS)


@pytest.fixture
def kafka_consumer_config(request: pytest.FixtureRequest) -> dict[str, object]:
    """A consumer configuration with a group of its own, reading from the start."""
    return {
        **kafka_connection_config(),
        "group.id": f"test-{uuid.uuid4().hex[:10]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test marked `kafka` gets the broker check before it runs, so an absent broker is
    # one clear failure, not a timeout deep inside a client.
    for item in items:
        if item.get_closest_marker("kafka") and "kafka_admin" not in getattr(
            item, "fixturenames", []
        ):
            item.fixturenames.append("kafka_admin")  # type: ignore[attr-defined]


@pytest.fixture
def secured_kafka(kafka_admin: AdminClient) -> Iterator[SecuredKafka]:
    """Users of the developers' broker's secured listener; the ACLs a test made are deleted
    after it."""
    secured = development_secured_kafka(kafka_admin)
    if not secured.ca.exists():
        pytest.fail(f"{secured.ca} is missing: 'scripts/services.sh up' makes it")
    yield secured
    secured.remove_acls()


def drop_test_database(server: psycopg.Connection, name: str) -> None:
    """Drops a database a test made, once the sessions of its subprocesses are gone. Not WITH
    (FORCE): that fails when an autovacuum worker (a superuser's process) happens to be in
    it, which a plain DROP cancels; a plain DROP waits up to 5 s for other sessions, here
    those of processes that just exited, and is tried again twice."""
    for attempt in range(3):
        try:
            server.execute(f'DROP DATABASE IF EXISTS "{name}"')
            return
        except psycopg.errors.ObjectInUse:
            if attempt == 2:
                raise
            time.sleep(1)
