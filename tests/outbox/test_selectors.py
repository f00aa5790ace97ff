import pytest
from django.db import transaction
from django.utils import timezone

import outbox
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.selectors import outbox_events_with_delivery

pytestmark = pytest.mark.django_db


def _event(key: str) -> OutboxEvent:
    with transaction.atomic():
        return outbox.publish(aggregate_type="o", aggregate_id=key, event_type="E", payload={})


def test_the_delivery_of_an_event_reads_the_same_whichever_relay_sent_it():
    now = timezone.now()
    by_claim_relay = _event("claim-done")
    OutboxEvent.objects.filter(pk=by_claim_relay.pk).update(
        status="DONE", published_at=now, kafka_partition=1, kafka_offset=7
    )
    failed_by_claim_relay = _event("claim-failed")
    OutboxEvent.objects.filter(pk=failed_by_claim_relay.pk).update(status="FAILED", attempts=10)
    by_log_relay = _event("log-done")
    OutboxDelivery.objects.create(
        event_id=by_log_relay.id, outcome="FAILED", published_at=now, error="timeout", relay="r"
    )
    OutboxDelivery.objects.create(
        event_id=by_log_relay.id,
        outcome="PUBLISHED",
        published_at=now,
        kafka_partition=2,
        kafka_offset=9,
        relay="r",
    )
    spent, retrying = _event("log-spent"), _event("log-retrying")
    for event, next_attempt_at in ((spent, None), (retrying, now)):
        OutboxHeldEvent.objects.create(
            event_id=event.id,
            shard=0,
            topic=event.topic,
            key=event.key,
            transaction_id=1,
            position=event.position,
            attempts=3,
            next_attempt_at=next_attempt_at,
        )
    _event("waiting")

    rows = {
        row.key: (
            row.delivery_status,
            row.delivered_at,
            row.delivered_partition,
            row.delivered_offset,
        )
        for row in outbox_events_with_delivery(OutboxEvent.objects.all())
    }

    assert rows == {
        "claim-done": ("DONE", now, 1, 7),
        "claim-failed": ("FAILED", None, None, None),
        "log-done": ("DONE", now, 2, 9),
        "log-spent": ("FAILED", None, None, None),
        "log-retrying": ("PENDING", None, None, None),
        "waiting": ("PENDING", None, None, None),
    }
