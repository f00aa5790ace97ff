"""The delivery checker: compares what was committed to the outbox, what is in the Kafka log
and what the consumer groups applied, and reports every way the promise can break.

The promise: every committed outbox event has exactly one effect in every group that should
have it, in the order of its key, and nothing is left waiting at the end. Duplicates in the
Kafka log are allowed (an at-least-once relay makes them) and only counted.

`check()` is a pure function over plain rows, tested without any service; `load_*` and
`read_log` gather the rows from PostgreSQL and Kafka; `delivery_check()` does both.
"""

import json
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from kafka_events.kafka import kafka_connection_config

# Examples kept per kind of problem in a report: enough to debug, small enough to print.
EXAMPLES = 5
LOG_READ_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class OutboxRow:
    event_id: str
    key: str
    seq: int
    status: str


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of the Kafka log. event_id is None for a record that carries none (poison)."""

    partition: int
    offset: int
    event_id: str | None
    key: str | None
    seq: int | None
    # The payload's "version", for events that carry their aggregate's version.
    version: int | None = None


@dataclass(frozen=True, slots=True)
class InboxRow:
    event_id: str
    status: str


@dataclass(frozen=True, slots=True)
class EffectRow:
    """One handler run; `id` orders the runs of one key as they were applied."""

    id: int
    event_id: str
    key: str
    seq: int


@dataclass
class GroupReport:
    group: str
    effects: int = 0
    # Committed outbox events with no effect in this group.
    lost: int = 0
    # Handler runs beyond the first for one event id.
    duplicate_effects: int = 0
    # Effects of one key applied out of sequence order.
    effect_inversions: int = 0
    # Inbox rows of outbox events that are not DONE.
    stuck_inbox: int = 0
    # Inbox rows of records that are not outbox events (poison), by status.
    foreign_inbox: dict[str, int] = field(default_factory=dict)
    # Effects of event ids the outbox never had, nor the Kafka log.
    phantom_effects: int = 0
    # Effects of records whose event the outbox does not hold (DeliveryReport.log_unreplicated).
    unreplicated_effects: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class DeliveryReport:
    topic: str
    events: int = 0
    stuck_outbox: int = 0
    log_records: int = 0
    # Copies beyond the first of one event id in the log: allowed, counted.
    log_duplicates: int = 0
    # DONE outbox events that are nowhere in the log.
    log_missing: int = 0
    # First copies of events whose sequence number is below one already seen for their key in
    # the partition: an event that reached the log after a later one of its key.
    log_inversions: int = 0
    # Later copies of events that came after a newer event of their key (a relay sent a batch
    # again after a crash: 1 2 3 1 2 3 4): allowed, counted. Among the duplicates; a consumer
    # that drops copies (the inbox) applies 1 2 3 4.
    log_replays: int = 0
    # Keys found in more than one partition: their order is not kept by Kafka.
    split_keys: int = 0
    # Records that are no outbox event's (poison records): without an event id, or with one
    # the outbox does not hold and no event's payload.
    log_foreign: int = 0
    # Records of event ids the outbox does not hold: events whose transaction committed on a
    # primary that failed over before its standby had it (asynchronous replication), sent
    # before the failover. A failure unless `unreplicated_allowed`.
    log_unreplicated: int = 0
    unreplicated_allowed: bool = False
    log_complete: bool = True
    groups: list[GroupReport] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return sum(group.lost for group in self.groups)

    @property
    def duplicate_effects(self) -> int:
        return sum(group.duplicate_effects for group in self.groups)

    @property
    def inversions(self) -> int:
        return self.log_inversions + sum(group.effect_inversions for group in self.groups)

    @property
    def stuck(self) -> int:
        return self.stuck_outbox + sum(group.stuck_inbox for group in self.groups)

    @property
    def unreplicated_effects(self) -> int:
        return sum(group.unreplicated_effects for group in self.groups)

    @property
    def ok(self) -> bool:
        return (
            (self.unreplicated_allowed or not (self.log_unreplicated or self.unreplicated_effects))
            and self.log_complete
            and self.lost == 0
            and self.duplicate_effects == 0
            and self.inversions == 0
            and self.stuck == 0
            and self.log_missing == 0
            and self.split_keys == 0
            and not any(group.phantom_effects for group in self.groups)
        )

    def problems(self) -> list[str]:
        """One line per broken promise; empty when the run passed."""
        found = []
        if not self.log_complete:
            found.append("the Kafka log could not be read to its end")
        counted = [
            ("lost events", self.lost),
            ("duplicate effects", self.duplicate_effects),
            ("order inversions", self.inversions),
            ("rows stuck", self.stuck),
            ("DONE events missing from the Kafka log", self.log_missing),
            ("keys split over partitions", self.split_keys),
            ("effects of unknown events", sum(g.phantom_effects for g in self.groups)),
        ]
        if not self.unreplicated_allowed:
            counted += [
                ("records of events the database does not hold", self.log_unreplicated),
                ("effects of events the database does not hold", self.unreplicated_effects),
            ]
        for name, value in counted:
            if value:
                found.append(f"{value} {name}")
        return found

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            lost=self.lost,
            duplicate_effects=self.duplicate_effects,
            inversions=self.inversions,
            stuck=self.stuck,
            ok=self.ok,
        )
        return data

    def format(self) -> str:
        lines = [
            f"topic {self.topic}: {self.events} committed events, {self.log_records} records in "
            f"the log ({self.log_duplicates} duplicates, of which {self.log_replays} replayed "
            f"after newer events of their key; {self.log_foreign} without event id; "
            f"{self.log_unreplicated} of events the database does not hold"
            f"{' (allowed)' if self.unreplicated_allowed else ''})",
            f"  outbox not DONE: {self.stuck_outbox}; DONE but not in the log: {self.log_missing}; "
            f"log order inversions: {self.log_inversions}; keys in several partitions: "
            f"{self.split_keys}",
        ]
        for group in self.groups:
            lines.append(
                f"  group {group.group}: {group.effects} effects, lost {group.lost}, duplicate "
                f"effects {group.duplicate_effects}, effect order inversions "
                f"{group.effect_inversions}, inbox not DONE {group.stuck_inbox}, foreign inbox "
                f"rows {group.foreign_inbox or 0}, effects of unknown events "
                f"{group.phantom_effects}, effects of events the database does not hold "
                f"{group.unreplicated_effects}"
            )
            for kind, examples in group.examples.items():
                lines.append(f"    e.g. {kind}: {', '.join(examples)}")
        for kind, examples in self.examples.items():
            lines.append(f"  e.g. {kind}: {', '.join(examples)}")
        lines.append("  result: " + ("PASS" if self.ok else "FAIL: " + "; ".join(self.problems())))
        return "\n".join(lines)


def _note(examples: dict[str, list[str]], kind: str, text: str) -> None:
    kept = examples.setdefault(kind, [])
    if len(kept) < EXAMPLES:
        kept.append(text)


def check(
    *,
    topic: str,
    outbox: Sequence[OutboxRow],
    log: Iterable[LogRecord],
    inbox: dict[str, Sequence[InboxRow]],
    effects: dict[str, Sequence[EffectRow]],
    log_complete: bool = True,
    unreplicated_allowed: bool = False,
) -> DeliveryReport:
    """Checks one run. `inbox` and `effects` are keyed by the consumer groups that should
    have applied every event of `outbox`."""
    report = DeliveryReport(
        topic=topic,
        events=len(outbox),
        log_complete=log_complete,
        unreplicated_allowed=unreplicated_allowed,
    )
    by_id = {row.event_id: row for row in outbox}
    for row in outbox:
        if row.status != "DONE":
            report.stuck_outbox += 1
            _note(report.examples, "outbox not DONE", f"{row.key}#{row.seq} {row.status}")

    copies: Counter[str] = Counter()
    # Per (partition, key): the highest sequence number seen so far in offset order.
    highest: dict[tuple[int, str], int] = {}
    partitions_of_key: dict[str, set[int]] = defaultdict(set)
    unreplicated: set[str] = set()
    for record in sorted(log, key=lambda r: (r.partition, r.offset)):
        report.log_records += 1
        if record.event_id is None or (record.event_id not in by_id and record.seq is None):
            # Not an outbox event's record (poison: no event id, or no event's payload).
            report.log_foreign += 1
            continue
        if record.event_id not in by_id:
            report.log_unreplicated += 1
            unreplicated.add(record.event_id)
            _note(
                report.examples,
                "record of an event the database does not hold",
                f"{record.key}#{record.seq} ({record.event_id})",
            )
            continue
        copies[record.event_id] += 1
        if record.key is None or record.seq is None:
            continue
        partitions_of_key[record.key].add(record.partition)
        slot = (record.partition, record.key)
        previous = highest.get(slot)
        if previous is not None and record.seq < previous and copies[record.event_id] > 1:
            report.log_replays += 1
        elif previous is not None and record.seq < previous:
            report.log_inversions += 1
            _note(
                report.examples,
                "log inversion",
                f"{record.key}#{record.seq} after #{previous} "
                f"at {record.partition}:{record.offset}",
            )
        highest[slot] = max(record.seq, previous if previous is not None else record.seq)
    report.log_duplicates = sum(count - 1 for count in copies.values())
    report.split_keys = sum(1 for parts in partitions_of_key.values() if len(parts) > 1)
    for row in outbox:
        if row.status == "DONE" and row.event_id not in copies and log_complete:
            report.log_missing += 1
            _note(report.examples, "DONE but not in the log", f"{row.key}#{row.seq}")

    for group in sorted(set(inbox) | set(effects)):
        report.groups.append(
            _check_group(group, by_id, unreplicated, inbox.get(group, ()), effects.get(group, ()))
        )
    return report


def _check_group(
    group: str,
    by_id: dict[str, OutboxRow],
    unreplicated: set[str],
    inbox: Sequence[InboxRow],
    effects: Sequence[EffectRow],
) -> GroupReport:
    result = GroupReport(group=group, effects=len(effects))
    runs: Counter[str] = Counter()
    highest: dict[str, int] = {}
    for effect in sorted(effects, key=lambda e: e.id):
        if effect.event_id in unreplicated:
            result.unreplicated_effects += 1
            continue
        if effect.event_id not in by_id:
            result.phantom_effects += 1
            _note(result.examples, "effect of an unknown event", effect.event_id)
            continue
        runs[effect.event_id] += 1
        if runs[effect.event_id] > 1:
            result.duplicate_effects += 1
            _note(result.examples, "duplicate effect", f"{effect.key}#{effect.seq}")
            continue
        previous = highest.get(effect.key)
        if previous is not None and effect.seq < previous:
            result.effect_inversions += 1
            _note(
                result.examples, "effect inversion", f"{effect.key}#{effect.seq} after #{previous}"
            )
        highest[effect.key] = max(effect.seq, previous if previous is not None else effect.seq)
    for event_id, row in by_id.items():
        if event_id not in runs:
            result.lost += 1
            _note(result.examples, "lost", f"{row.key}#{row.seq} ({event_id})")
    foreign: Counter[str] = Counter()
    for inbox_row in inbox:
        if inbox_row.event_id not in by_id:
            foreign[inbox_row.status] += 1
        elif inbox_row.status != "DONE":
            result.stuck_inbox += 1
            _note(result.examples, "inbox not DONE", f"{inbox_row.event_id} {inbox_row.status}")
    result.foreign_inbox = dict(foreign)
    return result


@dataclass
class VersionReport:
    """Kafka's order of each key's events against their aggregate's versions (the payload's
    "version", 1, 2, 3, ... as the writers incremented it under the aggregate's lock): the
    log must hold each key's versions in that order, none skipped."""

    keys: int = 0
    # First copies of events that carry a version; later copies (an at-least-once relay's
    # re-sends) are left out, as the consumers drop them.
    records: int = 0
    # Versions at or below one already seen for their key: reached Kafka after a later one.
    inversions: int = 0
    # Versions more than one above the highest seen for their key: one skipped at that point
    # (it comes later, an inversion, or never).
    gaps: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.inversions == 0 and self.gaps == 0

    def problems(self) -> list[str]:
        return [
            f"{value} {name}"
            for name, value in (
                ("version order inversions in the Kafka log", self.inversions),
                ("versions skipped in the Kafka log", self.gaps),
            )
            if value
        ]


def version_check(log: Iterable[LogRecord]) -> VersionReport:
    """Checks that each key's records, in (partition, offset) order, carry the versions 1, 2,
    3, ... of their aggregate: Kafka's order per key is the order of the writes."""
    report = VersionReport()
    seen: set[str] = set()
    highest: dict[str, int] = {}
    for record in sorted(log, key=lambda r: (r.partition, r.offset)):
        if record.event_id is None or record.key is None or record.version is None:
            continue
        if record.event_id in seen:
            continue
        seen.add(record.event_id)
        report.records += 1
        previous = highest.get(record.key, 0)
        where = (
            f"{record.key} v{record.version} after v{previous} "
            f"at {record.partition}:{record.offset}"
        )
        if record.version <= previous:
            report.inversions += 1
            if len(report.examples) < EXAMPLES:
                report.examples.append(f"inversion: {where}")
        elif record.version != previous + 1:
            report.gaps += 1
            if len(report.examples) < EXAMPLES:
                report.examples.append(f"gap: {where}")
        highest[record.key] = max(previous, record.version)
    report.keys = len(highest)
    return report


# --- gathering the rows ------------------------------------------------------------------


def load_outbox(*, topic: str) -> list[OutboxRow]:
    """Committed outbox events of `topic`; the sequence number comes from payload['seq']."""
    from outbox.models import OutboxEvent
    from outbox.selectors import outbox_events_discarded, outbox_events_with_delivery

    events = outbox_events_with_delivery(OutboxEvent.objects.filter(topic=topic))
    rows = outbox_events_discarded(events, discarded=False).values_list(
        "id", "key", "payload", "delivery_status"
    )
    return [
        OutboxRow(
            event_id=str(event_id),
            key=key,
            seq=int((payload or {}).get("seq", -1)) if isinstance(payload, dict) else -1,
            status=status,
        )
        for event_id, key, payload, status in rows.iterator(chunk_size=10_000)
    ]


def load_inbox(*, group: str, topic: str) -> list[InboxRow]:
    from inbox.models import InboxMessage

    rows = InboxMessage.objects.filter(consumer_group=group, topic=topic).values_list(
        "event_id", "status"
    )
    return [InboxRow(event_id=e, status=s) for e, s in rows.iterator(chunk_size=10_000)]


def load_effects(*, group: str) -> list[EffectRow]:
    from scenarios.models import ScenarioEffect

    rows = ScenarioEffect.objects.filter(consumer_group=group).values_list(
        "id", "event_id", "key", "seq"
    )
    return [
        EffectRow(id=i, event_id=e, key=k, seq=s) for i, e, k, s in rows.iterator(chunk_size=10_000)
    ]


def _parse(message: Any) -> LogRecord:
    headers = dict(message.headers() or [])
    raw_id = headers.get("event_id")
    event_id = raw_id.decode(errors="replace") if isinstance(raw_id, bytes) else None
    raw_key = message.key()
    key = raw_key.decode(errors="replace") if raw_key is not None else None
    seq = version = None
    try:
        value = json.loads(message.value() or b"null")
        if isinstance(value, dict) and isinstance(value.get("seq"), int):
            seq = value["seq"]
        if isinstance(value, dict) and isinstance(value.get("version"), int):
            version = value["version"]
    except (ValueError, UnicodeDecodeError):
        pass
    return LogRecord(
        partition=message.partition(),
        offset=message.offset(),
        event_id=event_id,
        key=key,
        seq=seq,
        version=version,
    )


def read_log(
    *, topic: str, timeout: float = LOG_READ_TIMEOUT_SECONDS
) -> tuple[list[LogRecord], bool]:
    """Reads the whole topic with a read_committed consumer, from the first offset to the high
    watermark each partition had when the read began. Returns the records and whether every
    partition was read to its end within `timeout` (an open transaction holds one back)."""
    consumer = Consumer(
        {
            **kafka_connection_config(),
            "group.id": f"delivery-check-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    records: list[LogRecord] = []
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        partitions = sorted(metadata.topics[topic].partitions)
        ends: dict[int, int] = {}
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout
        while ends and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=1.0):
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    continue
                if error is None:
                    records.append(_parse(message))
            # Control records and aborted transactions advance the position without a message.
            for position in consumer.position([TopicPartition(topic, p) for p in ends]):
                if position.offset >= ends[position.partition]:
                    del ends[position.partition]
        return records, not ends
    finally:
        consumer.close()


def delivery_check(
    *, topic: str, groups: Sequence[str], unreplicated_allowed: bool = False
) -> DeliveryReport:
    """Checks a topic and the consumer groups that should have applied all of its events."""
    outbox = load_outbox(topic=topic)
    log, complete = read_log(topic=topic)
    return check(
        topic=topic,
        outbox=outbox,
        log=log,
        inbox={group: load_inbox(group=group, topic=topic) for group in groups},
        effects={group: load_effects(group=group) for group in groups},
        log_complete=complete,
        unreplicated_allowed=unreplicated_allowed,
    )
