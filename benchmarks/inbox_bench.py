"""Inbox consumer benchmark: one process, real Kafka and PostgreSQL.

    .venv/bin/python benchmarks/inbox_bench.py [--only PART ...] [--tracing] [--events 100000]
        [--partitions 6] [--size 1024]

Puts --events relay-format records of about --size bytes on a new topic with --partitions
partitions, then measures in this one process (--only runs the parts named, repeatable:
"rates" is 1 to 3 and, with --tracing, 3a; "ordering" is 4; "held-key" is 5):
1. new events: the inbox consumer (batches, set-based dedup insert, a savepoint per
   handler, offsets committed after the database commit), every event new;
2. duplicates: the same records replayed to the same group (offsets reset to 0), all
   duplicates;
3. naive: a consumer that records each message in its own transaction and commits its
   offset synchronously after each one, on the first --naive-events records;
3a. with --tracing: the consumer on --events new records carrying a W3C traceparent, with
   tracing off (opentelemetry-api only, no SDK) and on (the SDK at 100 % sampling, a batch
   span processor, an exporter that drops the spans), alternated 3 times, each run on a
   topic, a group and records of its own: the best rate and CPU per event of each, the
   ratios on/off, and the process spans exported (one per event);
4. order per key: --ordering-events records on 1,000 keys (a topic of their own), consumed
   by new groups with ordering "none" and "key", without handler failures and with the
   first attempt of 1 % of the events failing (those of the key mode hold their keys, the
   later events of those keys are parked); side by side, the key mode's rate as a ratio of
   the none mode's;
5. one held key: --held-events records on ONE key whose first event fails: the time to
   consume them (all parked behind it) and the time the retry task takes to run the head
   and the parked events in order (inbox_sequence_run).
The handler is a no-op (apart from the failures of 4 and 5), so the figures measure the
inbox's own cost. It works in a database
of its own (--database, created and dropped here) and deletes its topic afterwards.
"""

import argparse
import json
import os
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")

import django

django.setup()

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import IntegrityError, connection, transaction  # noqa: E402
from django.test import override_settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks.tracing import (  # noqa: E402
    SAMPLED_ONE_IN,
    TRACING_ROUNDS,
    Measured,
    print_comparison,
    tracing_on,
)
from inbox.conf import inbox_settings  # noqa: E402
from inbox.config import inbox_consumer_config  # noqa: E402
from inbox.consumer import InboxConsumer  # noqa: E402
from inbox.models import InboxMessage  # noqa: E402
from inbox.records import parse_record  # noqa: E402
from inbox.registry import HandlerRegistry, scoped_registry  # noqa: E402
from inbox.registry import handler as register_handler  # noqa: E402
from inbox.services.recording import BatchResult  # noqa: E402
from kafka_events.kafka import kafka_connection_config  # noqa: E402

TIMEOUT_SECONDS = 60
EVENT_TYPE = "BenchEvent"
PARTS = ("rates", "ordering", "held-key")


def noop(message: InboxMessage) -> None:
    """The benchmark's handler: no work of its own."""


def produce(
    topic: str,
    *,
    events: int,
    size: int,
    keys: int = 5000,
    traceparents: bool = False,
    sampled_one_in: int = 1,
) -> float:
    """Puts `events` records on `topic` as the relay writes them; with `traceparents`, each
    carries the W3C traceparent of an event's creation context, a trace of its own: sampled
    (flags 01) for one record in `sampled_one_in`, the others not (00), as a root sampler at
    that ratio leaves them."""
    producer = Producer(
        {
            **kafka_connection_config(),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
        }
    )
    padding = "x" * max(0, size - 120)
    started = time.perf_counter()
    for number in range(events):
        aggregate_id = str(number % keys)
        payload = json.dumps({"number": number, "aggregate": aggregate_id, "padding": padding})
        headers: list[tuple[str, str | bytes | None]] = [
            ("event_id", str(uuid.uuid4()).encode()),
            ("event_type", EVENT_TYPE.encode()),
            ("aggregate_type", b"bench"),
            ("aggregate_id", aggregate_id.encode()),
            ("created_at", timezone.now().isoformat().encode()),
            ("content-type", b"application/json"),
        ]
        if traceparents:
            trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
            flags = "01" if number % sampled_one_in == 0 else "00"
            headers.append(("traceparent", f"00-{trace_id}-{span_id}-{flags}".encode()))
        while True:
            try:
                producer.produce(
                    topic, key=aggregate_id.encode(), value=payload.encode(), headers=headers
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(TIMEOUT_SECONDS) != 0:
        raise SystemExit("Kafka did not acknowledge every benchmark record")
    return time.perf_counter() - started


def registry_with(
    handle: Callable[[InboxMessage], None], *, topic: str, group: str
) -> HandlerRegistry:
    """A registry of its own in which `group` runs `handle` on the benchmark's events of
    `topic`."""
    registry = HandlerRegistry()
    with scoped_registry(registry):
        register_handler(event_type=EVENT_TYPE, topic=topic, group=group)(handle)
    return registry


def empty_inbox() -> None:
    # Each run on an empty table: a later run must not pay for the earlier rows.
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE inbox_message, inbox_attempt")


@dataclass
class ConsumerRun:
    seconds: float
    # time.process_time() (every thread: librdkafka's, a span processor's) over `seconds`.
    cpu_seconds: float
    result: BatchResult


def run_inbox_consumer(
    *, group: str, topic: str, registry: HandlerRegistry, events: int, batch_size: int
) -> ConsumerRun:
    total = BatchResult()
    timing: dict[str, float] = {}

    def on_batch(result: BatchResult) -> None:
        timing.setdefault("first", time.perf_counter())
        timing["last"] = time.perf_counter()
        timing["last_cpu"] = time.process_time()
        for name in ("consumed", "inserted", "duplicates", "processed", "failed", "parked"):
            setattr(total, name, getattr(total, name) + getattr(result, name))

    consumer = InboxConsumer(
        group=group,
        topics=[topic],
        registry=registry,
        batch_size=batch_size,
        poll_timeout=0.5,
        on_batch=on_batch,
    )
    consumer.start()
    # The clock starts when the first record arrives, so the group join is not counted.
    first = None
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while first is None:
        first = consumer.consumer.poll(0.5)
        if time.monotonic() > deadline:
            raise SystemExit("no records arrived")
    started, cpu_started = time.perf_counter(), time.process_time()
    consumer._in_flight = [first]
    consumer._in_flight.extend(consumer.consumer.consume(batch_size - 1, timeout=0))
    batch, consumer._in_flight = consumer._in_flight, []
    consumer._process(batch)
    try:
        while total.consumed < events:
            consumer.poll_batch()
    finally:
        consumer.close()
    return ConsumerRun(timing["last"] - started, timing["last_cpu"] - cpu_started, total)


def failing_first_attempts(fails: Callable[[InboxMessage], bool]) -> Any:
    """A handler whose first attempt fails for the events `fails` picks."""

    def handle(message: InboxMessage) -> None:
        if message.attempts == 0 and fails(message):
            raise RuntimeError("the first attempt of this event fails")

    return handle


def one_in_a_hundred(message: InboxMessage) -> bool:
    # By the event id, random, so that the failures fall on keys at random.
    return zlib.crc32(message.event_id.encode()) % 100 == 0


def the_first(message: InboxMessage) -> bool:
    return (message.payload or {})["number"] == 0


def consumer_rates(
    *, events: int, partitions: int, size: int, naive_events: int, batch_size: int
) -> None:
    """1 to 3: new events, all duplicates and the naive consumer, on one topic."""
    topic = create_topic(partitions)
    group = f"bench-inbox-{uuid.uuid4().hex[:8]}"
    try:
        registry = registry_with(noop, topic=topic, group=group)
        produced = produce(topic, events=events, size=size)
        print(f"  produced in {produced:.1f}s")

        new = run_inbox_consumer(
            group=group, topic=topic, registry=registry, events=events, batch_size=batch_size
        )
        assert new.result.inserted == new.result.processed == events, new.result
        reset_offsets(group, topic, partitions)
        dup = run_inbox_consumer(
            group=group, topic=topic, registry=registry, events=events, batch_size=batch_size
        )
        assert dup.result.duplicates == events, dup.result
        assert dup.result.processed == 0, dup.result
        naive_events = min(naive_events, events)
        naive_seconds = run_naive_consumer(group=f"{group}-naive", topic=topic, events=naive_events)
    finally:
        delete_topic(topic)

    new_rate = events / new.seconds
    dup_rate = events / dup.seconds
    naive_rate = naive_events / naive_seconds
    rows: list[tuple[str, Any, float, float]] = [
        ("inbox, new events", events, new.seconds, new_rate),
        ("inbox, all duplicates", events, dup.seconds, dup_rate),
        ("naive, commit per message", naive_events, naive_seconds, naive_rate),
    ]
    print(f"  {'consumer':<28}{'events':>9}{'seconds':>10}{'events/s':>11}")
    for name, count, seconds, rate in rows:
        print(f"  {name:<28}{count:>9}{seconds:>10.2f}{rate:>11.0f}")
    print(
        f"  new >= 5000/s: {'yes' if new_rate >= 5000 else 'NO'}; "
        f"duplicates/new: {dup_rate / new_rate:.2f}x; "
        f"new/naive: {new_rate / naive_rate:.1f}x (target >= 10x)"
    )


def new_events_run(
    *, events: int, partitions: int, size: int, batch_size: int, sampled_one_in: int = 1
) -> ConsumerRun:
    """The consumer on `events` new records carrying traceparents (see produce), on a topic,
    a group and an empty inbox_message table of their own, so that no run pays for another's."""
    topic = create_topic(partitions)
    try:
        produce(topic, events=events, size=size, traceparents=True, sampled_one_in=sampled_one_in)
        empty_inbox()
        group = f"bench-tracing-{uuid.uuid4().hex[:8]}"
        run = run_inbox_consumer(
            group=group,
            topic=topic,
            registry=registry_with(noop, topic=topic, group=group),
            events=events,
            batch_size=batch_size,
        )
    finally:
        delete_topic(topic)
    assert run.result.inserted == run.result.processed == events, run.result
    return run


def tracing_rates(*, events: int, partitions: int, size: int, batch_size: int) -> None:
    """3a: the consumer with tracing off and on, alternated TRACING_ROUNDS times."""

    def measured(run: ConsumerRun) -> Measured:
        consumed = run.result.consumed
        return Measured(
            rate=consumed / run.seconds, cpu_us_per_event=1_000_000 * run.cpu_seconds / consumed
        )

    def consumer_run(sampled_one_in: int = 1) -> ConsumerRun:
        return new_events_run(
            events=events,
            partitions=partitions,
            size=size,
            batch_size=batch_size,
            sampled_one_in=sampled_one_in,
        )

    print(
        f"tracing: the consumer on {events:,} new events carrying a traceparent, best of "
        f"{TRACING_ROUNDS} alternated runs, each on a topic and a group of its own"
    )
    off: list[Measured] = []
    on: list[Measured] = []
    sampled: list[Measured] = []
    exported = consumed = exported_sampled = 0
    for _ in range(TRACING_ROUNDS):
        off.append(measured(consumer_run()))
        with tracing_on(queue_size=events) as spans:
            run = consumer_run()
        on.append(measured(run))
        if spans.exported != run.result.consumed:
            print(
                f"  a run with tracing on exported {spans.exported:,} process spans for "
                f"{run.result.consumed:,} events consumed"
            )
        exported += spans.exported
        consumed += run.result.consumed
        with tracing_on(queue_size=events) as spans:
            sampled.append(measured(consumer_run(sampled_one_in=SAMPLED_ONE_IN)))
        exported_sampled += spans.exported
    print_comparison("consumer", off, on)
    print_comparison(f"consumer, 1 trace in {SAMPLED_ONE_IN} sampled", off, sampled, header=False)
    print(
        "  CPU: time.process_time() (every thread of this process) from the first record "
        "to the last batch committed, the rate's span"
    )
    print(
        f"  process spans exported in the runs with tracing on: {exported:,} for "
        f"{consumed:,} events consumed; with 1 trace in {SAMPLED_ONE_IN} sampled: "
        f"{exported_sampled:,}"
    )


def use_group_ordering(group: str, ordering: str) -> None:
    """INBOX["GROUP_ORDERING"] of the benchmark's group, for the rest of the process."""
    override_settings(INBOX={**settings.INBOX, "GROUP_ORDERING": {group: ordering}}).enable()


def ordering_rates(*, events: int, partitions: int, size: int, batch_size: int) -> None:
    """4: the rates of ordering none and key, without and with 1 % first-attempt failures."""
    topic = create_topic(partitions)
    try:
        produce(topic, events=events, size=size, keys=1000)
        print(
            f"order per key: {events} events on 1,000 keys, {partitions} partitions; a new "
            "group per run"
        )
        print(
            f"  {'run':<36}{'seconds':>9}{'events/s':>10}{'parked':>8}{'failed':>8}"
            f"{'CPU ms/1000':>13}"
        )
        rates: dict[tuple[str, bool], float] = {}
        for failures in (False, True):
            for ordering in ("none", "key"):
                empty_inbox()
                group = f"bench-ordering-{uuid.uuid4().hex[:8]}"
                use_group_ordering(group, ordering)
                handle = failing_first_attempts(one_in_a_hundred) if failures else noop
                registry = registry_with(handle, topic=topic, group=group)
                cpu_started = time.process_time()
                run = run_inbox_consumer(
                    group=group,
                    topic=topic,
                    registry=registry,
                    events=events,
                    batch_size=batch_size,
                )
                cpu_ms = 1000 * (time.process_time() - cpu_started) / events * 1000
                seconds, result = run.seconds, run.result
                rate = events / seconds
                rates[(ordering, failures)] = rate
                name = f"{ordering}, {'1 % first attempts fail' if failures else 'no failures'}"
                print(
                    f"  {name:<36}{seconds:>9.2f}{rate:>10.0f}{result.parked:>8}{result.failed:>8}"
                    f"{cpu_ms:>13.0f}"
                )
        plain = rates[("key", False)] / rates[("none", False)]
        failing = rates[("key", True)] / rates[("none", True)]
        slowest = min(rates.values())
        print(
            f"  key/none without failures: {plain:.2f}x (target >= 0.9x); with failures: "
            f"{failing:.2f}x (target >= 0.8x); every run >= 5000/s: "
            f"{'yes' if slowest >= 5000 else 'NO'} (slowest {slowest:.0f}/s)"
        )
    finally:
        delete_topic(topic)


def held_key(*, events: int, size: int, batch_size: int) -> None:
    """5: parking and running again `events` events behind one failed head."""
    from inbox.services.sequences import inbox_sequence_run

    topic = create_topic(1)
    try:
        produce(topic, events=events, size=size, keys=1)
        group = f"bench-held-{uuid.uuid4().hex[:8]}"
        use_group_ordering(group, "key")
        registry = registry_with(failing_first_attempts(the_first), topic=topic, group=group)
        parked_run = run_inbox_consumer(
            group=group, topic=topic, registry=registry, events=events, batch_size=batch_size
        )
        parking, result = parked_run.seconds, parked_run.result
        started = time.perf_counter()
        InboxMessage.objects.filter(consumer_group=group, status="PENDING").update(
            next_attempt_at=timezone.now()
        )
        run = inbox_sequence_run(group=group, topic=topic, key="0", registry=registry)
        running = time.perf_counter() - started
        left = InboxMessage.objects.filter(consumer_group=group).exclude(status="DONE").count()
        print(
            f"one held key: {events} events on one key, the first failing once: consumed "
            f"(1 failed, {result.parked} parked) in {parking:.2f}s; the head and the parked "
            f"events run in order in {running:.2f}s ({run.done} done, {left} not done); "
            f"{parking + running:.2f}s in all (target <= 5 s for 10,000)"
        )
    finally:
        delete_topic(topic)


def create_topic(partitions: int) -> str:
    topic = f"bench.inbox.{uuid.uuid4().hex[:10]}"
    admin = AdminClient(kafka_connection_config())
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(
        timeout=TIMEOUT_SECONDS
    )
    return topic


def delete_topic(topic: str) -> None:
    # Held in a name until the answer: a client collected meanwhile cancels its requests.
    admin = AdminClient(kafka_connection_config())
    admin.delete_topics([topic])[topic].result(timeout=TIMEOUT_SECONDS)


def reset_offsets(group: str, topic: str, partitions: int) -> None:
    admin = AdminClient(kafka_connection_config())
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p, 0) for p in range(partitions)]
    )
    for future in admin.alter_consumer_group_offsets([request]).values():
        future.result(timeout=TIMEOUT_SECONDS)


def run_naive_consumer(*, group: str, topic: str, events: int) -> float:
    """Per message: one transaction (insert, handler in a savepoint, mark done), then a
    synchronous commit of that message's offset."""
    consumer = Consumer(inbox_consumer_config(group=group))
    consumer.subscribe([topic])
    done = 0
    started: float | None = None
    try:
        while done < events:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            started = started or time.perf_counter()
            record = parse_record(message)
            with transaction.atomic():
                try:
                    with transaction.atomic():
                        row = InboxMessage.objects.create(
                            event_id=record.event_id,
                            consumer_group=group,
                            topic=record.topic,
                            partition=record.partition,
                            offset=record.offset,
                            key=record.key,
                            event_type=record.event_type,
                            aggregate_type=record.aggregate_type,
                            aggregate_id=record.aggregate_id,
                            payload=record.payload,
                            headers=record.headers,
                            published_at=record.published_at,
                        )
                except IntegrityError:
                    row = None
                if row is not None:
                    with transaction.atomic():
                        noop(row)
                    row.status = InboxMessage.Status.DONE
                    row.attempts = 1
                    row.processed_at = timezone.now()
                    row.save(update_fields=["status", "attempts", "processed_at"])
            consumer.commit(message=message, asynchronous=False)
            done += 1
    finally:
        consumer.close()
    assert started is not None
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", choices=PARTS, action="append", help="run only these parts (repeatable)"
    )
    parser.add_argument("--events", type=int, default=100_000, help="events per run (rates)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per event")
    parser.add_argument("--naive-events", type=int, default=5_000)
    parser.add_argument("--batch-size", type=int, default=inbox_settings.BATCH_SIZE)
    parser.add_argument("--ordering-events", type=int, default=100_000)
    parser.add_argument("--held-events", type=int, default=10_000)
    parser.add_argument("--database", default="bench_inbox")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="rates: also the consumer with tracing off and on, their CPU and the ratios",
    )
    args = parser.parse_args()
    parts = [part for part in PARTS if part in (args.only or PARTS)]

    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = args.database
    original_name = settings.DATABASES["default"]["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        print(
            f"inbox benchmark ({', '.join(parts)}): {args.events} events of {args.size} B on "
            f"{args.partitions} partitions, batch size {args.batch_size}, database "
            f"{args.database}"
        )
        if "rates" in parts:
            consumer_rates(
                events=args.events,
                partitions=args.partitions,
                size=args.size,
                naive_events=args.naive_events,
                batch_size=args.batch_size,
            )
            if args.tracing:
                tracing_rates(
                    events=args.events,
                    partitions=args.partitions,
                    size=args.size,
                    batch_size=args.batch_size,
                )
        if "ordering" in parts:
            ordering_rates(
                events=args.ordering_events,
                partitions=args.partitions,
                size=args.size,
                batch_size=args.batch_size,
            )
        if "held-key" in parts:
            held_key(events=args.held_events, size=args.size, batch_size=args.batch_size)
    finally:
        connection.creation.destroy_test_db(original_name, verbosity=0)


if __name__ == "__main__":
    main()
