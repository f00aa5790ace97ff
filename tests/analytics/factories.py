"""A small delivery history with known lags, duplicates and planted problems.

`planted_history()` writes outbox and inbox rows (and, for DONE events, their Kafka records)
and returns what the analytics job must find in them: every lag, every duplicate count and
every planted problem, computed here in plain Python.
"""

import random
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import Producer

from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from project.kafka import kafka_connection_config

SLA = timedelta(minutes=5)
TYPES_BY_TOPIC_ROLE = {"orders": ("order.created", "order.paid"), "users": ("user.signed_up",)}
GROUPS_BY_TOPIC_ROLE = {"orders": ("billing", "shipping"), "users": ("audit",)}


def history_start(*, now: datetime | None = None) -> datetime:
    """Two days back, on the hour: every SLA has passed by the time the job runs."""
    now = now or datetime.now(tz=UTC)
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(days=2)


@dataclass
class History:
    since: datetime
    until: datetime
    topics: dict[str, str]  # role -> topic name
    # (hour, topic, event_type, consumer_group, stage) -> lags in seconds
    lags: dict[tuple[datetime, str, str, str, str], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # (hour, topic, consumer_group) -> [unique events, duplicate deliveries, max copies]
    duplicates: dict[tuple[datetime, str, str], list[int]] = field(default_factory=dict)
    # (hour, topic) -> counts
    relay: dict[tuple[datetime, str], dict[str, int]] = field(default_factory=dict)
    # (kind, event id, consumer group)
    findings: set[tuple[str, str, str]] = field(default_factory=set)
    kafka_records: int = 0
    outbox_rows: int = 0
    inbox_rows: int = 0

    @property
    def expected_consumers(self) -> dict[str, list[str]]:
        return {
            self.topics["orders"]: list(GROUPS_BY_TOPIC_ROLE["orders"]),
            # By event type, not by topic: both ways of naming expectations are exercised.
            "user.signed_up": list(GROUPS_BY_TOPIC_ROLE["users"]),
        }


class _Kafka:
    def __init__(self) -> None:
        self.producer = Producer({**kafka_connection_config(), "linger.ms": 0})
        self.count = 0

    def send(self, topic: str, key: str, event_id: str | None) -> tuple[int, int]:
        delivered: list[tuple[int, int]] = []

        def report(error: Any, message: Any) -> None:
            assert error is None, error
            delivered.append((message.partition(), message.offset()))

        headers: list[tuple[str, str | bytes | None]] = (
            [("event_id", event_id.encode())] if event_id else []
        )
        self.producer.produce(topic, key=key, value=b"{}", headers=headers, on_delivery=report)
        self.producer.flush(30)
        assert delivered, "Kafka did not confirm the record"
        self.count += 1
        return delivered[0]

    def send_aborted(self, topic: str, key: str, event_id: str) -> None:
        """The record in a Kafka transaction that aborts, as a fenced transactional relay's
        batch: it takes an offset in the log, but read_committed readers never see it."""
        producer = Producer(
            {**kafka_connection_config(), "transactional.id": f"analytics-test-{uuid.uuid4()}"}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, key=key, value=b"{}", headers=[("event_id", event_id.encode())])
        producer.flush(30)
        producer.abort_transaction(30)


def _ms(rng: random.Random, low: int, high: int) -> timedelta:
    return timedelta(milliseconds=rng.randint(low, high))


def planted_history(*, topics: dict[str, str], since: datetime, seed: int = 7) -> History:
    """Writes two hours of history for the `orders` and `users` topics (committed: call with
    database access outside a test transaction, Spark reads it over JDBC)."""
    rng = random.Random(seed)
    history = History(since=since, until=since + timedelta(hours=2), topics=topics)
    kafka = _Kafka()
    events: list[OutboxEvent] = []
    messages: list[InboxMessage] = []
    relay: dict[tuple[datetime, str], dict[str, int]] = defaultdict(
        lambda: {"events": 0, "published": 0, "pending": 0, "failed": 0, "retried": 0}
    )

    # Plain events, each with its problems planted by index.
    specs: list[dict[str, Any]] = []
    for role, count in (("orders", 160), ("users", 60)):
        for index in range(count):
            specs.append({"role": role, "index": index})
    for spec in specs:
        role, index = spec["role"], spec["index"]
        topic = topics[role]
        event_type = TYPES_BY_TOPIC_ROLE[role][index % len(TYPES_BY_TOPIC_ROLE[role])]
        event_id = str(uuid.uuid4())
        key = f"{role}-{index % 13}"
        created = since + timedelta(
            seconds=rng.randint(0, 2 * 3600 - 1), microseconds=rng.randint(0, 999_999)
        )
        hour = created.replace(minute=0, second=0, microsecond=0)
        status = OutboxEvent.Status.DONE
        attempts = 1
        if role == "orders" and index in (3, 4):
            status, attempts = OutboxEvent.Status.PENDING, 0  # stuck
        elif role == "orders" and index == 5:
            status, attempts = OutboxEvent.Status.FAILED, 10
        elif index % 17 == 0:
            attempts = 3  # retried by the relay, then published
        counts = relay[(hour, topic)]
        counts["events"] += 1
        counts["published"] += status == OutboxEvent.Status.DONE
        counts["pending"] += status == OutboxEvent.Status.PENDING
        counts["failed"] += status == OutboxEvent.Status.FAILED
        counts["retried"] += attempts > 1
        if status == OutboxEvent.Status.PENDING:
            history.findings.add(("stuck", event_id, ""))
        published = None
        partition = offset = None
        if status == OutboxEvent.Status.DONE:
            published = created + _ms(rng, 5, 3000)
            if role == "orders" and index in (7, 8):
                # Recorded DONE at an offset, but the record never reached the log.
                partition, offset = 0, 0
                history.findings.add(("missing_from_kafka", event_id, ""))
            else:
                partition, offset = kafka.send(topic, key, event_id)
                if (role == "orders" and index in (9, 10)) or (role == "users" and index == 11):
                    kafka.send(topic, key, event_id)  # a relay retry after a lost ack
                    history.findings.add(("resent", event_id, ""))
                if role == "orders" and index == 12:
                    kafka.send_aborted(topic, key, event_id)  # no copy: not "re-sent"
            history.lags[(hour, topic, event_type, "", "publish")].append(
                (published - created).total_seconds()
            )
        events.append(
            OutboxEvent(
                id=uuid.UUID(event_id),
                aggregate_type=role,
                aggregate_id=key,
                event_type=event_type,
                payload={"n": index},
                topic=topic,
                key=key,
                status=status,
                attempts=attempts,
                created_at=created,
                published_at=published,
                kafka_partition=partition,
                kafka_offset=offset,
            )
        )
        if published is None:
            continue
        for group in GROUPS_BY_TOPIC_ROLE[role]:
            if role == "orders" and index in (20, 21) and group == "shipping":
                history.findings.add(("not_consumed", event_id, group))
                continue  # never recorded by shipping
            consume = _ms(rng, 10, 20_000)
            if role == "users" and index == 30:
                consume = SLA + timedelta(minutes=5)  # recorded, but after the SLA
                history.findings.add(("not_consumed", event_id, group))
            processed = published + consume
            duplicate_count = 0
            if index % 10 == 1:
                duplicate_count = 1
            if index % 40 == 2:
                duplicate_count = 3
            if (role, index) in (("orders", 9), ("orders", 10), ("users", 11)):
                duplicate_count = max(duplicate_count, 1)
            messages.append(
                InboxMessage(
                    event_id=event_id,
                    consumer_group=group,
                    topic=topic,
                    partition=partition if partition is not None else 0,
                    offset=offset if offset is not None else 0,
                    event_type=event_type,
                    status=InboxMessage.Status.DONE,
                    attempts=1,
                    published_at=published,
                    received_at=processed - timedelta(milliseconds=2),
                    processed_at=processed,
                    duplicate_count=duplicate_count,
                    last_duplicate_at=processed + timedelta(seconds=1) if duplicate_count else None,
                )
            )
            history.lags[(hour, topic, event_type, group, "consume")].append(
                (processed - published).total_seconds()
            )
            history.lags[(hour, topic, event_type, group, "end_to_end")].append(
                (processed - created).total_seconds()
            )
            key3 = (hour, topic, group)
            unique, duplicates, most = history.duplicates.get(key3, [0, 0, 0])
            history.duplicates[key3] = [
                unique + 1,
                duplicates + duplicate_count,
                max(most, 1 + duplicate_count),
            ]

    # Records the job must ignore: another producer's event, and a record with no event id.
    kafka.send(topics["orders"], "foreign", str(uuid.uuid4()))
    kafka.send(topics["orders"], "foreign", None)
    # An event outside the window, with a problem the job must not report for this window.
    outside = since - timedelta(minutes=30)
    events.append(
        OutboxEvent(
            aggregate_type="orders",
            aggregate_id="outside",
            event_type="order.created",
            payload={},
            topic=topics["orders"],
            key="outside",
            status=OutboxEvent.Status.PENDING,
            created_at=outside,
        )
    )

    OutboxEvent.objects.bulk_create(events)
    InboxMessage.objects.bulk_create(messages)
    history.relay = dict(relay)
    history.kafka_records = kafka.count
    history.outbox_rows = len(events) - 1
    history.inbox_rows = len(messages)
    return history
