"""A small delivery history with known lags, duplicates and planted problems.

`planted_history()` writes outbox and inbox rows (and, for DONE events, their Kafka records)
and returns what the analytics job must find in them: every lag, every duplicate count and
every planted problem, computed here in plain Python.

The history is written the way the relay leaves it: delivery records and held events beside
event rows it never updates. Part of it went out before the claim relay was removed, and
reads as migration 0012 handed it over: PUBLISHED records under that relay's name.
"""

import random
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import Producer

from inbox.models import InboxMessage
from kafka_events.kafka import kafka_connection_config
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.services.event_log.shards import shard_of

SLA = timedelta(minutes=5)
TYPES_BY_TOPIC_ROLE = {"orders": ("order.created", "order.paid"), "users": ("user.signed_up",)}
GROUPS_BY_TOPIC_ROLE = {"orders": ("billing", "shipping"), "users": ("audit",)}
# The relay name on the records of the events the claim relay delivered before its removal
# (outbox/migrations/0012_claim_relay_removed.py writes them).
CLAIM_RELAY_HANDED_OVER = "claim-relay"
# A replay goes out this long after the event's first publication.
REPLAY_DELAY = timedelta(minutes=30)


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
    # event id -> (published_at, kafka_partition, kafka_offset) of its latest publication
    placements: dict[str, tuple[datetime | None, int | None, int | None]] = field(
        default_factory=dict
    )
    # event id -> its attempts, as the job must count them
    attempts: dict[str, int] = field(default_factory=dict)
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


class KafkaWriter:
    """Writes records to the log as the relay would, each confirmed before the next."""

    def __init__(self) -> None:
        self.producer = Producer({**kafka_connection_config(), "linger.ms": 0})
        self.count = 0

    def send(
        self, topic: str, key: str, event_id: str | None, *, timestamp: datetime | None = None
    ) -> tuple[int, int]:
        """Writes one record (stamped now, as the relay's are, or at `timestamp`) and returns
        its partition and offset."""
        delivered: list[tuple[int, int]] = []

        def report(error: Any, message: Any) -> None:
            assert error is None, error
            delivered.append((message.partition(), message.offset()))

        headers: list[tuple[str, str | bytes | None]] = (
            [("event_id", event_id.encode())] if event_id else []
        )
        self.producer.produce(
            topic,
            key=key,
            value=b"{}",
            headers=headers,
            on_delivery=report,
            timestamp=int(timestamp.timestamp() * 1000) if timestamp else 0,
        )
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


def delivery_record(
    *,
    event_id: str | uuid.UUID,
    outcome: str,
    at: datetime,
    partition: int | None = None,
    offset: int | None = None,
    error: str = "",
    relay: str | None = None,
) -> OutboxDelivery:
    """A delivery record as the relay (or an operator's discard) appends it (unsaved: records
    of one event are saved in the order they happened)."""
    if outcome == OutboxDelivery.Outcome.FAILED and not error:
        error = "no delivery report in time"
    if relay is None:
        relay = "analytics-test" if outcome != OutboxDelivery.Outcome.DISCARDED else "operator"
    return OutboxDelivery(
        event_id=event_id,
        outcome=outcome,
        published_at=at,
        kafka_partition=partition,
        kafka_offset=offset,
        error=error,
        relay=relay,
    )


def held_event(
    *,
    event: OutboxEvent,
    attempts: int = 0,
    next_attempt_at: datetime | None = None,
    last_error: str = "",
) -> OutboxHeldEvent:
    """An event the relay holds (unsaved): a failed head waiting for its retry
    (attempts > 0, next_attempt_at set), one whose attempts are spent (next_attempt_at None),
    or one queued behind its key's head or replayed (attempts 0)."""
    return OutboxHeldEvent(
        event_id=event.id,
        shard=shard_of(event.key),
        topic=event.topic,
        key=event.key,
        transaction_id=0,
        position=event.position if isinstance(event.position, int) else 0,
        event_transaction_id=0,
        event_position=event.position if isinstance(event.position, int) else 0,
        event_created_at=event.created_at,
        attempts=attempts,
        next_attempt_at=next_attempt_at,
        last_error=last_error,
    )


def failed_tries(*, event_id: str | uuid.UUID, count: int, after: datetime) -> list[OutboxDelivery]:
    """`count` FAILED records, a second apart from `after` on."""
    return [
        delivery_record(
            event_id=event_id,
            outcome=OutboxDelivery.Outcome.FAILED,
            at=after + timedelta(seconds=number),
        )
        for number in range(count)
    ]


@dataclass
class _EventLog:
    """What the relay recorded of one event: its delivery records in order, and its held
    row."""

    records: list[OutboxDelivery] = field(default_factory=list)
    held_attempts: int | None = None  # None: not held
    held_next_attempt_at: datetime | None = None


def planted_history(*, topics: dict[str, str], since: datetime, seed: int = 7) -> History:
    """Writes two hours of history for the `orders` and `users` topics (committed: call with
    database access outside a test transaction, Spark reads it over JDBC): event rows as
    publish() wrote them, the relay's delivery records and held events. Some events went out
    through the claim relay before its removal (records as migration 0012 wrote them)."""
    rng = random.Random(seed)
    history = History(since=since, until=since + timedelta(hours=2), topics=topics)
    kafka = KafkaWriter()
    events: list[OutboxEvent] = []
    logs: dict[str, _EventLog] = {}
    messages: list[InboxMessage] = []
    relay_counts: dict[tuple[datetime, str], dict[str, int]] = defaultdict(
        lambda: {
            "events": 0,
            "published": 0,
            "pending": 0,
            "failed": 0,
            "retried": 0,
            "max_attempts": 0,
        }
    )

    # Plain events, each with its problems planted by index.
    specs: list[dict[str, Any]] = []
    for role, count in (("orders", 162), ("users", 61)):
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
        handed_over = False  # published by the claim relay, before its removal
        log = logs[event_id] = _EventLog()
        replayed = (role, index) in (("orders", 161), ("users", 60))
        if role == "orders" and index == 3:
            # Stuck: never tried (the relay has not read it).
            status, attempts = OutboxEvent.Status.PENDING, 0
        elif role == "orders" and index == 4:
            # Stuck: failed twice, waiting for its retry (the relay holds its key).
            status, attempts = OutboxEvent.Status.PENDING, 2
            log.records = failed_tries(event_id=event_id, count=2, after=created)
            log.held_attempts = 2
            log.held_next_attempt_at = datetime.now(tz=UTC) + timedelta(hours=1)
        elif role == "orders" and index == 5:
            # Attempts spent: FAILED (held for good by the relay).
            status, attempts = OutboxEvent.Status.FAILED, 10
            log.records = failed_tries(event_id=event_id, count=10, after=created)
            log.held_attempts = 10
        elif role == "orders" and index == 160:
            # Attempts spent, then discarded by an operator: FAILED, kept for audit.
            status, attempts = OutboxEvent.Status.FAILED, 10
            discarded_at = created + timedelta(minutes=20)
            log.records = [
                *failed_tries(event_id=event_id, count=10, after=created),
                delivery_record(
                    event_id=event_id, outcome=OutboxDelivery.Outcome.DISCARDED, at=discarded_at
                ),
            ]
        elif index % 17 == 0 and not replayed:
            attempts = 3  # retried by the relay, then published
            log.records = failed_tries(event_id=event_id, count=2, after=created)
        elif index % 4 == 0 and not replayed:
            handed_over = True
        counts = relay_counts[(hour, topic)]
        counts["events"] += 1
        counts["published"] += status == OutboxEvent.Status.DONE
        counts["pending"] += status == OutboxEvent.Status.PENDING
        counts["failed"] += status == OutboxEvent.Status.FAILED
        counts["retried"] += attempts > 1
        counts["max_attempts"] = max(counts["max_attempts"], attempts)
        history.attempts[event_id] = attempts
        if status == OutboxEvent.Status.PENDING:
            history.findings.add(("stuck", event_id, ""))
        published = received_from = None
        partition = offset = None
        if status == OutboxEvent.Status.DONE:
            published = received_from = created + _ms(rng, 5, 3000)
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
            log.records.append(
                delivery_record(
                    event_id=event_id,
                    outcome=OutboxDelivery.Outcome.PUBLISHED,
                    at=published,
                    partition=partition,
                    offset=offset,
                    # Users 60 went out first through the claim relay, then, replayed, through
                    # the relay that replaced it.
                    relay=CLAIM_RELAY_HANDED_OVER
                    if handed_over or (replayed and role == "users")
                    else None,
                )
            )
            if replayed:
                # Replayed by an operator with its own id: published again, a second copy in
                # the log; the event's latest record tells the second publication.
                published = published + REPLAY_DELAY
                partition, offset = kafka.send(topic, key, event_id)
                log.records.append(
                    delivery_record(
                        event_id=event_id,
                        outcome=OutboxDelivery.Outcome.PUBLISHED,
                        at=published,
                        partition=partition,
                        offset=offset,
                    )
                )
                history.findings.add(("resent", event_id, ""))
            history.lags[(hour, topic, event_type, "", "publish")].append(
                (published - created).total_seconds()
            )
        history.placements[event_id] = (published, partition, offset)
        events.append(
            OutboxEvent(
                id=uuid.UUID(event_id),
                aggregate_type=role,
                aggregate_id=key,
                event_type=event_type,
                payload={"n": index},
                topic=topic,
                key=key,
                created_at=created,
            )
        )
        if published is None or received_from is None:
            continue
        # Consumers recorded the event's first publication (a replay is a duplicate).
        for group in GROUPS_BY_TOPIC_ROLE[role]:
            if role == "orders" and index in (20, 21) and group == "shipping":
                history.findings.add(("not_consumed", event_id, group))
                continue  # never recorded by shipping
            consume = _ms(rng, 10, 20_000)
            if role == "users" and index == 30:
                consume = SLA + timedelta(minutes=5)  # recorded, but after the SLA
                history.findings.add(("not_consumed", event_id, group))
            processed = received_from + consume
            duplicate_count = 0
            if index % 10 == 1:
                duplicate_count = 1
            if index % 40 == 2:
                duplicate_count = 3
            if (role, index) in (("orders", 9), ("orders", 10), ("users", 11)) or replayed:
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
                    published_at=received_from,
                    received_at=processed - timedelta(milliseconds=2),
                    processed_at=processed,
                    duplicate_count=duplicate_count,
                    last_duplicate_at=processed + timedelta(seconds=1) if duplicate_count else None,
                )
            )
            # The job measures the consume lag from the latest publication, as the outbox
            # tells it (negative for a replayed event).
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
    # An event outside the window, never sent (stuck), a problem the job must not report for
    # this window.
    outside = since - timedelta(minutes=30)
    events.append(
        OutboxEvent(
            aggregate_type="orders",
            aggregate_id="outside",
            event_type="order.created",
            payload={},
            topic=topics["orders"],
            key="outside",
            created_at=outside,
        )
    )

    OutboxEvent.objects.bulk_create(events)
    _event_log_write(events, logs)
    InboxMessage.objects.bulk_create(messages)
    history.relay = dict(relay_counts)
    history.kafka_records = kafka.count
    history.outbox_rows = len(events) - 1
    history.inbox_rows = len(messages)
    return history


def _event_log_write(events: list[OutboxEvent], logs: dict[str, _EventLog]) -> None:
    """The relay's delivery records (in the order they happened, event by event) and held
    events."""
    records: list[OutboxDelivery] = []
    held: list[OutboxHeldEvent] = []
    for event in events:
        log = logs.get(str(event.id))
        if log is None:
            continue
        records += log.records
        if log.held_attempts is not None:
            held.append(
                held_event(
                    event=event,
                    attempts=log.held_attempts,
                    next_attempt_at=log.held_next_attempt_at,
                    last_error=log.records[-1].error if log.records else "",
                )
            )
    OutboxDelivery.objects.bulk_create(records)
    OutboxHeldEvent.objects.bulk_create(held)
