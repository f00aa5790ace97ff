"""Order per key through real Kafka and PostgreSQL: a consumer, handler failures, the retry
task. The effects of each key must come in the order the events were produced with ordering
"key"; with ordering "none" the same run inverts them (so the check can fail)."""

import uuid

import pytest
from django.db import connection

from inbox import handler
from inbox.models import InboxMessage
from inbox.services.retries import inbox_messages_retry_due
from tests.app_settings import override_app_settings
from tests.inbox.conftest import consume_until, record_effect
from tests.inbox.factories import Event, produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

KEYS, EVENTS_PER_KEY = 5, 30


def effects_in_order(group: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT event_id FROM inbox_test_effect WHERE consumer_group = %s ORDER BY id",
            [group],
        )
        return [event_id for (event_id,) in cursor.fetchall()]


def inversions(produced: dict[str, list[str]], applied: list[str]) -> int:
    """Pairs of one key's events whose effects came in the other order than produced."""
    position = {event_id: index for index, event_id in enumerate(applied)}
    count = 0
    for events in produced.values():
        ranks = [position[event_id] for event_id in events]
        count += sum(1 for i, a in enumerate(ranks) for b in ranks[i + 1 :] if a > b)
    return count


@pytest.mark.parametrize("ordering", ["key", "none"])
@override_app_settings("INBOX", RETRY_BASE_SECONDS=0.0, RETRY_MAX_SECONDS=0.0)
def test_handler_failures_keep_or_break_the_order_of_each_key(
    ordering, kafka_topic, inbox_registry, effects, run_consumer
):
    topic, group = kafka_topic(partitions=3), f"test-ordering-{uuid.uuid4().hex[:10]}"
    events = [
        Event(aggregate_id=f"key-{number % KEYS}", payload={"number": number})
        for number in range(KEYS * EVENTS_PER_KEY)
    ]
    produced: dict[str, list[str]] = {}
    for event in events:
        produced.setdefault(event.aggregate_id, []).append(event.event_id)
    failed_first_tries: list[str] = []

    @handler(event_type="OrderPlaced", topic=topic, group=group)
    def apply(message: InboxMessage) -> None:
        record_effect(group=group, event_id=message.event_id)
        # The first try of every tenth event fails.
        if (message.payload or {})["number"] % 10 == 0 and message.attempts == 0:
            failed_first_tries.append(message.event_id)
            raise RuntimeError("first try fails")

    with override_app_settings("INBOX", GROUP_ORDERING={group: ordering}):
        produce(topic, events)
        consumer = run_consumer(group=group)
        consume_until(
            consumer,
            lambda: InboxMessage.objects.filter(consumer_group=group).count() == len(events),
        )
        parked = InboxMessage.objects.filter(consumer_group=group, status="PARKED").count()
        for _ in range(20):
            if not InboxMessage.objects.filter(consumer_group=group).exclude(status="DONE"):
                break
            inbox_messages_retry_due(limit=1000)

    assert len(failed_first_tries) == len(events) // 10, "the fault did not strike"
    assert set(
        InboxMessage.objects.filter(consumer_group=group).values_list("status", flat=True)
    ) == {"DONE"}
    applied = effects_in_order(group)
    assert sorted(applied) == sorted(event.event_id for event in events)  # once each
    if ordering == "key":
        assert parked > 0
        assert inversions(produced, applied) == 0
    else:
        assert parked == 0
        assert inversions(produced, applied) > 0
