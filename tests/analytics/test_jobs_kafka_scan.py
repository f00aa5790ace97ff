"""The job's Kafka scan (analytics/jobs.py, kafka_scan_plan) against the real broker: where
it starts reading each partition, and the re-sent copies it finds there."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from analytics.jobs import RECORD_CLOCK_SKEW
from analytics.models import AnalyticsRun, ReconciliationFinding
from analytics.services import analytics_run_execute
from outbox.models import OutboxDelivery, OutboxEvent
from tests.analytics.factories import KafkaWriter, delivery_record

# Spark reads the rows over JDBC, in its own connections: they must be committed.
pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def test_a_copy_written_below_the_window_s_first_recorded_offset_counts_as_re_sent(
    spark: Any, kafka_topic: Any
) -> None:
    topic = kafka_topic()
    until = datetime.now(tz=UTC).replace(microsecond=0)
    since = until - timedelta(hours=1)
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
        for event_id in (resent_id, other_id)
    )
    for event_id, (partition, offset) in ((resent_id, recorded), (other_id, other)):
        delivery_record(
            event_id=event_id,
            outcome=OutboxDelivery.Outcome.PUBLISHED,
            at=created + timedelta(seconds=1),
            partition=partition,
            offset=offset,
        ).save()

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
