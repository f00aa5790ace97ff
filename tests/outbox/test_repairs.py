from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import outbox
from outbox.errors import IllegalTransition
from outbox.models import OutboxEvent
from outbox.selectors import outbox_quarantined_keys
from outbox.services.claims import outbox_events_claim
from outbox.services.repairs import (
    REPLAY_OF_HEADER,
    outbox_event_discard,
    outbox_event_replay,
    outbox_event_retry,
    outbox_events_retry,
    outbox_key_release,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("claim_relay")]


def publish(aggregate_id: str = "A", **changes) -> OutboxEvent:
    with transaction.atomic():
        return outbox.publish(
            aggregate_type="order",
            aggregate_id=aggregate_id,
            event_type="E",
            payload={"n": 1},
            topic="repairs",
            **changes,
        )


def test_discarding_a_failed_event_lets_its_key_flow_and_keeps_the_row():
    blocked, waiting = publish(), publish()
    OutboxEvent.objects.filter(pk=blocked.pk).update(status="FAILED", attempts=3)
    assert [e.id for e in outbox_events_claim(relay_id="r", batch_size=10)] == []
    assert outbox_quarantined_keys()[0].blocking_event_id == str(blocked.id)

    outbox_event_discard(event=OutboxEvent.objects.get(pk=blocked.pk))

    assert [e.id for e in outbox_events_claim(relay_id="r", batch_size=10)] == [waiting.id]
    assert OutboxEvent.objects.get(pk=blocked.pk).discarded_at is not None
    assert outbox_quarantined_keys() == []


@pytest.mark.parametrize("status", ["PENDING", "DONE"])
def test_only_failed_events_can_be_discarded(status):
    event = publish()
    OutboxEvent.objects.filter(pk=event.pk).update(status=status)
    with pytest.raises(IllegalTransition, match="Only FAILED events"):
        outbox_event_discard(event=OutboxEvent.objects.get(pk=event.pk))


def test_retry_refuses_a_published_event():
    event = publish()
    OutboxEvent.objects.filter(pk=event.pk).update(status="DONE")
    with pytest.raises(IllegalTransition, match="replay it instead"):
        outbox_event_retry(event=OutboxEvent.objects.get(pk=event.pk))


def test_retry_leaves_an_event_a_relay_is_sending_to_that_relay():
    in_flight, waiting = publish("A"), publish("B")
    OutboxEvent.objects.filter(pk=waiting.pk).update(next_attempt_at=timezone.now() + timedelta(1))
    [claimed] = outbox_events_claim(relay_id="relay-1", batch_size=10)
    assert claimed.id == in_flight.id

    with pytest.raises(IllegalTransition, match="being sent by a relay right now"):
        outbox_event_retry(event=OutboxEvent.objects.get(pk=in_flight.pk))
    assert outbox_events_retry(event_ids=[in_flight.pk, waiting.pk]) == 1
    # The lease holds: no second relay can claim the row while the first may be sending it.
    assert outbox_events_claim(relay_id="relay-2", batch_size=10)[0].id == waiting.id
    assert OutboxEvent.objects.get(pk=in_flight.pk).locked_by == "relay-1"

    OutboxEvent.objects.filter(pk=in_flight.pk).update(
        locked_until=timezone.now() - timedelta(seconds=1)
    )
    assert outbox_event_retry(event=OutboxEvent.objects.get(pk=in_flight.pk)).locked_by == ""


def test_replay_with_the_same_id_queues_the_event_again_behind_its_key():
    first, later = publish(), publish()
    OutboxEvent.objects.filter(pk__in=[first.pk, later.pk]).update(
        status="DONE", kafka_partition=0, kafka_offset=41, published_at=timezone.now()
    )
    replayed = outbox_event_replay(event=OutboxEvent.objects.get(pk=first.pk), new_event_id=False)
    assert replayed.id == first.id
    assert (replayed.status, replayed.attempts) == ("PENDING", 0)
    assert "offset 41" in replayed.last_error
    assert replayed.position > later.position


def test_replay_with_a_new_id_publishes_a_copy_naming_the_original():
    original = publish(headers={"tenant": "eu"})
    OutboxEvent.objects.filter(pk=original.pk).update(status="DONE")
    copy = outbox_event_replay(event=OutboxEvent.objects.get(pk=original.pk), new_event_id=True)
    assert copy.id != original.id
    assert copy.headers == {"tenant": "eu", REPLAY_OF_HEADER: str(original.id)}
    assert (copy.payload, copy.topic, copy.key) == (original.payload, original.topic, original.key)


def test_a_pending_event_cannot_be_replayed():
    with pytest.raises(IllegalTransition, match="retry it instead"):
        outbox_event_replay(event=publish(), new_event_id=True)


def test_releasing_a_key_discards_its_failed_event_and_makes_its_backoff_due():
    failed, in_backoff = publish("A"), publish("B")
    OutboxEvent.objects.filter(pk=failed.pk).update(status="FAILED", attempts=3)
    OutboxEvent.objects.filter(pk=in_backoff.pk).update(
        attempts=1, next_attempt_at=timezone.now() + timedelta(hours=1)
    )
    assert outbox_key_release(topic="repairs", key="A") == 1
    assert outbox_key_release(topic="repairs", key="B") == 1
    claimed = {e.id for e in outbox_events_claim(relay_id="r", batch_size=10)}
    assert claimed == {in_backoff.id}
    assert OutboxEvent.objects.get(pk=failed.pk).discarded_at is not None


def test_a_claim_finds_the_next_events_of_other_keys_behind_a_deep_quarantined_key():
    # The oldest 30 due events all wait behind A's FAILED event: more than the first pass of
    # a claim of 5 examines. The second pass still finds the next event of B and C.
    blocked = publish("A")
    OutboxEvent.objects.filter(pk=blocked.pk).update(status="FAILED", attempts=3)
    for _ in range(30):
        publish("A")
    b1, b2, c1 = publish("B"), publish("B"), publish("C")

    claimed = outbox_events_claim(relay_id="r", batch_size=5)

    assert [e.id for e in claimed] == [b1.id, c1.id]
    assert [e.id for e in outbox_events_claim(relay_id="other", batch_size=5)] == []
    assert b2.id not in {e.id for e in claimed}  # B's order: b2 waits for b1


def test_a_claim_behind_another_relays_batch_takes_only_the_next_event_of_free_keys():
    # Relay r holds the next event of A and B; twenty more of each queue behind them.
    for _ in range(21):
        publish("A")
        publish("B")
    held = outbox_events_claim(relay_id="r", batch_size=2)
    assert {e.aggregate_id for e in held} == {"A", "B"}
    c1 = publish("C")

    assert [e.id for e in outbox_events_claim(relay_id="other", batch_size=10)] == [c1.id]
