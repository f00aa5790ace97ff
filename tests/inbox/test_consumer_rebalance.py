"""inbox/consumer.py: rebalance callbacks that run inside consume(), without a broker.

librdkafka runs on_revoke/on_lost inside poll() and consume(); these tests stand a fake
client in for the real one to call them at that exact point.
"""

from collections.abc import Callable, Sequence

from confluent_kafka import Message, TopicPartition

from inbox.consumer import InboxConsumer
from inbox.registry import HandlerRegistry

TOPIC = "orders"


def record(partition: int, offset: int) -> Message:
    return Message(topic=TOPIC, partition=partition, offset=offset, value=b"{}")


class FakeClient:
    """poll() returns one record; consume() runs a rebalance callback, then returns the
    records it fetched, as librdkafka does when a rebalance lands in the call."""

    def __init__(
        self, first: Message, fetched: list[Message], during_consume: Callable[[], None]
    ) -> None:
        self.first = first
        self.fetched = fetched
        self.during_consume = during_consume

    def poll(self, timeout: float) -> Message:
        return self.first

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        self.during_consume()
        return self.fetched


def consumer_with(
    first: Message, fetched: list[Message], rebalance: str, partition: int
) -> tuple[InboxConsumer, list[list[tuple[int, int]]]]:
    consumer = InboxConsumer(group="g", topics=[TOPIC], registry=HandlerRegistry())
    consumer._assigned = {(TOPIC, 0), (TOPIC, 1)}
    processed: list[list[tuple[int, int]]] = []

    def process(messages: Sequence[Message]) -> None:
        processed.append([(m.partition() or 0, m.offset() or 0) for m in messages])

    def during_consume() -> None:
        callback = consumer._on_revoke if rebalance == "revoke" else consumer._on_lost
        callback(consumer._consumer, [TopicPartition(TOPIC, partition)])  # type: ignore[arg-type]

    consumer._process = process  # type: ignore[method-assign]
    consumer._consumer = FakeClient(first, fetched, during_consume)  # type: ignore[assignment]
    return consumer, processed


def test_records_fetched_by_the_consume_call_that_revoked_are_processed():
    # Cooperative rebalancing: partition 1 is revoked inside consume(), which also fetched
    # a record of partition 0, still assigned.
    consumer, processed = consumer_with(record(1, 5), [record(0, 7)], "revoke", partition=1)
    consumer.poll_batch()
    # The revoke finished the in-flight record of partition 1; the fetched one is the batch.
    assert processed == [[(1, 5)], [(0, 7)]]
    assert consumer._in_flight == []


def test_records_fetched_by_the_consume_call_that_lost_a_partition_are_processed():
    consumer, processed = consumer_with(record(1, 5), [record(0, 7)], "lost", partition=1)
    consumer.poll_batch()
    # The in-flight record of the lost partition is dropped; the fetched one is the batch.
    assert processed == [[(0, 7)]]
    assert consumer._in_flight == []
