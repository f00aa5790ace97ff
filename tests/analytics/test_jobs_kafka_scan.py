"""The job's Kafka scan (analytics/jobs.py, kafka_scan_plan) against the real broker: where
it starts reading each partition, and the re-sent copies it finds there."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka.admin import ResourceType

from analytics.jobs import RECORD_CLOCK_SKEW
from analytics.models import AnalyticsRun, ReconciliationFinding
from analytics.services import analytics_run_execute
from outbox.models import OutboxDelivery, OutboxEvent
from scenarios.secured_kafka import READER, SecuredKafka
from tests.analytics.factories import KafkaWriter, delivery_record

# Spark reads the rows over JDBC, in its own connections: they must be committed.
pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def _window() -> tuple[datetime, datetime]:
    until = datetime.now(tz=UTC).replace(microsecond=0)
    return until - timedelta(hours=1), until


def _delivered(topic: str, created: datetime, *sent: tuple[str, tuple[int, int]]) -> None:
    """Outbox events of `topic`, each with a PUBLISHED record at its (partition, offset)."""
    OutboxEvent.objects.bulk_create(
        OutboxEvent(
            id=uuid.UUID(event_id),
            aggregate_type="order",
            aggregate_id="k",
            event_type="order.created",
            payload={},
            topic=topic,
            key="k",
            created_at=created,
        )
        for event_id, _ in sent
    )
    for event_id, (partition, offset) in sent:
        delivery_record(
            event_id=event_id,
            outcome=OutboxDelivery.Outcome.PUBLISHED,
            at=created + timedelta(seconds=1),
            partition=partition,
            offset=offset,
        ).save()


def test_a_copy_written_below_the_window_s_first_recorded_offset_counts_as_re_sent(
    spark: Any, kafka_topic: Any
) -> None:
    topic = kafka_topic()
    since, until = _window()
    created = since + timedelta(minutes=1)
    resent_id, other_id = str(uuid.uuid4()), str(uuid.uuid4())
    kafka = KafkaWriter()
    # An event of an earlier window, written long before this one opened: not read.
    kafka.send(topic, "k", str(uuid.uuid4()), timestamp=since - 2 * RECORD_CLOCK_SKEW)
    # The relay's first send of the event reached the log, but its acknowledgement was lost;
    # the retry is the copy the relay recorded, the window's first recorded offset.
    lost = kafka.send(topic, "k", resent_id)
    recorded = kafka.send(topic, "k", resent_id)
    other = kafka.send(topic, "k", other_id)
    _delivered(topic, created, (resent_id, recorded), (other_id, other))

    run = analytics_run_execute(since=since, until=until, spark=spark, kafka_scan=True)

    assert run.status == AnalyticsRun.Status.SUCCEEDED, run.error
    assert lost[1] < recorded[1] < other[1]
    findings = ReconciliationFinding.objects.filter(run=run)
    assert [(f.kind, str(f.event_id), f.kafka_offsets) for f in findings] == [
        ("resent", resent_id, [lost[1], recorded[1]])
    ]
    # The scan starts at the first record written since the window opened (less the clocks'
    # margin), not at the log start: the earlier window's record is not read.
    assert run.kafka_records == 3


def test_the_scan_reads_through_tls_and_scram_as_a_user_allowed_to_read_the_topic(
    spark: Any, kafka_topic: Any, secured_kafka: SecuredKafka
) -> None:
    """KAFKA_EVENTS' librdkafka properties reach Spark's Java client in its own names (a JAAS
    login, a PEM trust store): the scan reads the records as the secured listener's user."""
    topic = kafka_topic()
    reader = secured_kafka.user("analytics-reader")
    secured_kafka.allow(reader, ResourceType.TOPIC, topic, *READER)
    since, until = _window()
    created = since + timedelta(minutes=1)
    resent_id = str(uuid.uuid4())
    kafka = KafkaWriter()
    lost = kafka.send(topic, "k", resent_id)
    _delivered(topic, created, (resent_id, kafka.send(topic, "k", resent_id)))
    secured_config = {
        "bootstrap.servers": secured_kafka.bootstrap,
        **secured_kafka.client_config(reader),
    }

    run = analytics_run_execute(
        since=since, until=until, spark=spark, kafka_scan=True, kafka_config=secured_config
    )

    assert run.status == AnalyticsRun.Status.SUCCEEDED, run.error
    assert run.kafka_records == 2
    [finding] = ReconciliationFinding.objects.filter(run=run)
    assert (finding.kind, str(finding.event_id), finding.kafka_offsets[0]) == (
        "resent",
        resent_id,
        lost[1],
    )


def test_a_topic_the_user_may_not_describe_fails_the_run_instead_of_counting_it_missing(
    spark: Any, kafka_topic: Any, secured_kafka: SecuredKafka
) -> None:
    topic = kafka_topic()
    stranger = secured_kafka.user("analytics-stranger")
    since, until = _window()
    event_id = str(uuid.uuid4())
    _delivered(
        topic, since + timedelta(minutes=1), (event_id, KafkaWriter().send(topic, "k", event_id))
    )
    config = {"bootstrap.servers": secured_kafka.bootstrap, **secured_kafka.client_config(stranger)}

    run = analytics_run_execute(
        since=since, until=until, spark=spark, kafka_scan=True, kafka_config=config
    )

    assert run.status == AnalyticsRun.Status.FAILED
    assert f"refused the metadata of topic {topic}" in run.error, run.error
    assert "TOPIC_AUTHORIZATION_FAILED" in run.error, run.error
    assert not ReconciliationFinding.objects.filter(run=run).exists()
