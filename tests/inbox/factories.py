"""Records as the outbox relay writes them, produced straight to Kafka for inbox tests."""

import datetime as dt
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message, Producer

from kafka_events.kafka import kafka_connection_config

FLUSH_TIMEOUT_SECONDS = 30


@dataclass
class Event:
    event_type: str = "OrderPlaced"
    aggregate_type: str = "order"
    # Distinct for every event: with order per key, two events of one key are a sequence (the
    # second parks behind a deferred or failed first), which a test must ask for by name.
    aggregate_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    payload: Any = field(default_factory=lambda: {"amount": 10})
    event_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    extra_headers: dict[str, str] = field(default_factory=dict)
    created_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    @property
    def key(self) -> bytes:
        return self.aggregate_id.encode()

    @property
    def value(self) -> bytes:
        return json.dumps(self.payload).encode()

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        headers = {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "created_at": self.created_at.isoformat(),
            "content-type": "application/json",
            **self.extra_headers,
        }
        return [(name, value.encode()) for name, value in headers.items()]

    def message(self, *, topic: str = "t", partition: int = 0, offset: int = 0) -> Message:
        """A confluent_kafka.Message as a consumer would get it, without a broker."""
        return Message(
            topic=topic,
            partition=partition,
            offset=offset,
            key=self.key,
            value=self.value,
            headers=self.headers(),
            timestamp=(1, int(dt.datetime.now(dt.UTC).timestamp() * 1000)),
        )


def make_events(count: int, **fields: Any) -> list[Event]:
    return [Event(**fields) for _ in range(count)]


def _producer() -> Producer:
    return Producer({**kafka_connection_config(), "enable.idempotence": True, "acks": "all"})


def produce(topic: str, events: Iterable[Event], *, partition: int | None = None) -> None:
    """Produces each event as a relay record and waits for the broker's acknowledgements."""
    producer = _producer()
    failures: list[str] = []

    def report(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    for event in events:
        producer.produce(
            topic,
            key=event.key,
            value=event.value,
            headers=event.headers(),
            on_delivery=report,
            partition=-1 if partition is None else partition,  # -1: the key's partition
        )
        producer.poll(0)
    assert producer.flush(FLUSH_TIMEOUT_SECONDS) == 0
    assert not failures, failures


def produce_raw(
    topic: str,
    *,
    value: bytes | None,
    headers: list[tuple[str, str | bytes | None]] | None = None,
    key: bytes | None = None,
    partition: int = 0,
) -> None:
    """Produces one record exactly as given: poison records are made with this."""
    producer = _producer()
    producer.produce(topic, key=key, value=value, headers=headers or [], partition=partition)
    assert producer.flush(FLUSH_TIMEOUT_SECONDS) == 0
