"""Spark is slow to start: one local SparkSession (2 cores, 1 GB) serves every test here.

Spark reads the test database over JDBC through its own connections, so it sees committed
rows only: the planted history is written outside any test transaction, by a module fixture.
"""

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from django.test import override_settings

from analytics.models import AnalyticsRun
from analytics.services import analytics_run_execute
from analytics.spark import spark_session_get, spark_session_stop
from inbox.models import InboxMessage
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from tests.analytics.factories import SLA, History, history_start, planted_history
from tests.conftest import KAFKA_TIMEOUT_SECONDS


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    with override_settings(SPARK_MASTER="local[2]", SPARK_DRIVER_MEMORY="1g"):
        session = spark_session_get(app_name="analytics-tests")
    yield session
    spark_session_stop()


@pytest.fixture(scope="module")
def history_topics(kafka_admin: AdminClient) -> Iterator[dict[str, str]]:
    """Topics of the module's history, new for each module: a Kafka scan of one history
    never reads the records of another."""
    suffix = uuid.uuid4().hex[:10]
    topics = {
        "orders": f"test.analytics.orders.{suffix}",
        "users": f"test.analytics.users.{suffix}",
    }
    futures = kafka_admin.create_topics(
        [NewTopic(topics["orders"], num_partitions=2), NewTopic(topics["users"], num_partitions=1)],
        operation_timeout=KAFKA_TIMEOUT_SECONDS,
    )
    for future in futures.values():
        future.result(timeout=KAFKA_TIMEOUT_SECONDS)
    yield topics
    for future in kafka_admin.delete_topics(list(topics.values())).values():
        future.result(timeout=KAFKA_TIMEOUT_SECONDS)


def analytics_settings(history: History) -> override_settings:
    return override_settings(
        ANALYTICS_CONSUME_SLA=SLA,
        ANALYTICS_EXPECTED_CONSUMERS=history.expected_consumers,
        ANALYTICS_KAFKA_SCAN=True,
    )


@pytest.fixture(scope="module")
def planted(
    django_db_setup: None,
    django_db_blocker: Any,
    spark: Any,
    history_topics: dict[str, str],
) -> Iterator[tuple[History, AnalyticsRun]]:
    """The planted history, committed, and the job's run over its window."""
    with django_db_blocker.unblock():
        history = planted_history(topics=history_topics, since=history_start())
        with analytics_settings(history):
            run = analytics_run_execute(since=history.since, until=history.until, spark=spark)
    yield history, run
    with django_db_blocker.unblock():
        AnalyticsRun.objects.all().delete()
        InboxMessage.objects.all().delete()
        OutboxEvent.objects.all().delete()
        OutboxDelivery.objects.all().delete()
        OutboxHeldEvent.objects.all().delete()
