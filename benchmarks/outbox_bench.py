"""Outbox benchmark: drain, producer and relay rates, then publish lag under load.

    .venv/bin/python benchmarks/outbox_bench.py [--events 50000] [--lag-seconds 10]

Runs against the real PostgreSQL and Kafka of `make services-up`, in a database of its own
(`<DATABASE name>_bench`, recreated each run) and topics of its own. Prints its figures;
asserts nothing: the targets are in the README and the closing notes.
"""

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")
os.environ["OUTBOX_NUDGE_ON_COMMIT"] = "false"

import django  # noqa: E402

from benchmarks.databases import recreate_database, sibling_database_url  # noqa: E402

BENCH_DATABASE_SUFFIX = "_bench"
PAYLOAD_BYTES = 1024
KEYS = 10_000


def payload(number: int) -> dict:
    # About 1 KB once encoded.
    return {"number": number, "seq": number // KEYS, "data": "x" * (PAYLOAD_BYTES - 40)}


def insert_events(topic: str, count: int, keys: int = KEYS) -> None:
    """Bulk-inserts PENDING events, as many publish() calls would, but fast."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic,
                                      key, status, attempts, next_attempt_at, last_error,
                                      created_at, updated_at, locked_by)
            SELECT gen_random_uuid(), 'order', 'order-' || (n %% %(keys)s), 'OrderPlaced',
                   jsonb_build_object('number', n, 'seq', n / %(keys)s,
                                      'data', repeat('x', %(filler)s)),
                   '{}'::jsonb, %(topic)s, 'order-' || (n %% %(keys)s), 'PENDING', 0, now(), '',
                   now(), now(), ''
            FROM generate_series(0, %(count)s - 1) AS n
            """,
            {"keys": keys, "filler": PAYLOAD_BYTES - 40, "topic": topic, "count": count},
        )
        # Rows a real workload adds over time (autovacuum keeps their statistics) appear
        # here at once: give the planner their statistics before the clock starts.
        cursor.execute("ANALYZE outbox_event")


def create_topic(partitions: int = 6) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    from project.kafka import kafka_connection_config

    name = f"bench.outbox.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka_connection_config())
    admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result(30)
    return name


def delete_topics(names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    from project.kafka import kafka_connection_config

    admin = AdminClient(kafka_connection_config())
    for future in admin.delete_topics(names).values():
        future.result(30)


def measure_drain(topic: str, count: int, batch_size: int) -> float:
    """Claim and mark with the relay's own statements, without Kafka."""
    from django.db import transaction
    from django.utils import timezone

    from outbox.services.claims import Delivery, outbox_events_claim, outbox_events_mark_published

    insert_events(topic, count)
    started = time.perf_counter()
    drained = 0
    while True:
        events = outbox_events_claim(relay_id="bench-drain", batch_size=batch_size)
        if not events:
            break
        now = timezone.now()
        with transaction.atomic():
            outbox_events_mark_published(
                deliveries=[
                    Delivery(event_id=e.id, partition=0, offset=i, published_at=now)
                    for i, e in enumerate(events)
                ]
            )
        drained += len(events)
    elapsed = time.perf_counter() - started
    if drained != count:
        raise RuntimeError(f"drained {drained} of {count} events")
    return count / elapsed


def measure_claim_behind_backlog(topic: str, count: int, keys: int, batch_size: int) -> float:
    """Milliseconds a claim takes when `count` events queue on `keys` keys and another relay
    holds the next event of every key: it finds nothing to take, and must find that fast."""
    from outbox.models import OutboxEvent
    from outbox.services.claims import outbox_events_claim

    insert_events(topic, count, keys)
    held = outbox_events_claim(relay_id="bench-holder", batch_size=keys)
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        taken = outbox_events_claim(relay_id="bench-late", batch_size=batch_size)
        timings.append((time.perf_counter() - started) * 1000)
        if taken:
            raise RuntimeError(f"a claim took {len(taken)} events queued behind held ones")
    OutboxEvent.objects.filter(topic=topic).delete()
    if len(held) != keys:
        raise RuntimeError(f"the holder claimed {len(held)} events, not one per key ({keys})")
    return statistics.median(timings)


def measure_producer(topic: str, count: int) -> float:
    """The raw confluent-kafka producer with the relay's settings and the same records."""
    from confluent_kafka import Producer

    from outbox.producer import producer_config

    producer = Producer(producer_config())
    values = [json.dumps(payload(n), separators=(",", ":")).encode() for n in range(count)]
    delivered = 0

    def on_delivery(error: object, message: object) -> None:
        nonlocal delivered
        if error is None:
            delivered += 1

    started = time.perf_counter()
    for number, value in enumerate(values):
        while True:
            try:
                producer.produce(
                    topic,
                    key=f"order-{number % KEYS}".encode(),
                    value=value,
                    headers=[("event_id", str(uuid.uuid4()).encode())],
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    assert delivered == count, (delivered, count)
    return count / elapsed


def measure_relay(topic: str, count: int, batch_size: int, *, transactional: bool) -> float:
    from django.conf import settings

    from outbox.models import OutboxEvent
    from outbox.producer import close_producers, get_producer
    from outbox.relay import Relay

    settings.OUTBOX_RELAY_TRANSACTIONAL = transactional
    transactional_id = f"bench-{uuid.uuid4().hex[:8]}" if transactional else None
    relay = Relay(batch_size=batch_size, transactional_id=transactional_id)
    get_producer(transactional_id=transactional_id)  # connected before the clock starts
    insert_events(topic, count)
    started = time.perf_counter()
    published = 0
    while published < count:
        result = relay.run(max_seconds=600)
        published += result.published
        if not result.claimed:
            break
    elapsed = time.perf_counter() - started
    close_producers()
    settings.OUTBOX_RELAY_TRANSACTIONAL = False
    assert not OutboxEvent.objects.filter(topic=topic).exclude(status="DONE").exists()
    return count / elapsed


PUBLISHER_PROCESSES = 4


def _publish_paced(
    topic: str,
    event_type: str,
    rate: float,
    seconds: float,
    first: int,
    costs: "multiprocessing.Queue[tuple[int, float]]",
) -> None:
    """One publisher process: `rate` events a second through outbox.publish(), 10 per
    transaction, catching up when it falls behind. Puts (events, CPU seconds spent in the
    publishing transactions) on `costs`."""
    from django.db import connection, transaction

    import outbox

    per_transaction = 10
    interval = per_transaction / rate
    started = time.perf_counter()
    next_at = started
    number = first
    published, cpu_seconds = 0, 0.0
    try:
        while time.perf_counter() - started < seconds:
            cpu_started = time.process_time()
            with transaction.atomic():
                for _ in range(per_transaction):
                    outbox.publish(
                        aggregate_type="order",
                        aggregate_id=f"order-{number % KEYS}",
                        event_type=event_type,
                        payload=payload(number),
                        topic=topic,
                    )
                    number += PUBLISHER_PROCESSES
            cpu_seconds += time.process_time() - cpu_started
            published += per_transaction
            next_at += interval
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    finally:
        connection.close()
        costs.put((published, cpu_seconds))


@dataclass
class OfferedLoad:
    rate: float  # events/s actually achieved
    publish_cpu_ms: float  # CPU milliseconds per event in the publishers' transactions


def offer_load(
    topic: str, rate: int, seconds: float, event_type: str = "OrderPlaced"
) -> OfferedLoad:
    """Publishes `rate` events a second of `event_type` to `topic` from PUBLISHER_PROCESSES
    processes (threads of one process share its interpreter lock and could not offer 1,000
    events/s)."""
    from django.db import connections

    from outbox.models import OutboxEvent

    connections.close_all()  # a forked child must open its own connection
    context = multiprocessing.get_context("fork")
    costs = context.Queue()
    publishers = [
        context.Process(
            target=_publish_paced,
            args=(topic, event_type, rate / PUBLISHER_PROCESSES, seconds, number, costs),
        )
        for number in range(PUBLISHER_PROCESSES)
    ]
    started = time.perf_counter()
    for publisher in publishers:
        publisher.start()
    for publisher in publishers:
        publisher.join()
    elapsed = time.perf_counter() - started
    if any(publisher.exitcode for publisher in publishers):
        raise RuntimeError("a publisher process failed")
    published = OutboxEvent.objects.filter(topic=topic, event_type=event_type).count()
    reported = [costs.get(timeout=10) for _ in publishers]
    events = sum(count for count, _ in reported) or 1
    cpu_ms = 1000 * sum(cpu for _, cpu in reported) / events
    return OfferedLoad(rate=published / elapsed, publish_cpu_ms=cpu_ms)


def warm_up(topic: str) -> None:
    """A few events through the running relay, so that the producer knows the topic's leaders
    before the clock starts, as it would in a deployment that has been running."""
    offer_load(topic, 40, 0.5, event_type="WarmUp")
    lag_percentiles(topic, event_type="WarmUp", timeout=30)


def lag_percentiles(
    topic: str, event_type: str = "OrderPlaced", timeout: float = 60
) -> tuple[float, float, float, int]:
    """Publish lag percentiles of the events of `event_type` on `topic`, once they are DONE
    or `timeout` seconds have passed."""
    from outbox.models import OutboxEvent

    events = OutboxEvent.objects.filter(topic=topic, event_type=event_type)
    deadline = time.monotonic() + timeout
    while events.exclude(status="DONE").exists():
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    rows = events.filter(status="DONE").values_list("created_at", "published_at")
    lags = sorted(
        (published - created).total_seconds() * 1000
        for created, published in rows
        if published is not None
    )
    not_done = events.count() - len(lags)
    if len(lags) < 2:
        return float("nan"), float("nan"), float("nan"), not_done
    quantiles = statistics.quantiles(lags, n=100, method="inclusive")
    return quantiles[49], quantiles[98], lags[-1], not_done


def report_lag(
    mode: str, offered: OfferedLoad, p50: float, p99: float, worst: float, missing: int
) -> None:
    print(
        f"  {mode:<30}{offered.rate:6.0f} events/s  p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
        f"  max {worst:7.1f} ms  not done {missing}"
        f"  publish() {offered.publish_cpu_ms:.2f} ms CPU/event"
    )


def start(command: list[str], environment: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=BASE_DIR,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lag-rate", type=int, default=1000, help="offered load, events/s")
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    parser.add_argument("--keep-database", action="store_true", help="reuse its database")
    parser.add_argument("--rates-only", action="store_true", help="skip the publish lag runs")
    options = parser.parse_args()

    url = sibling_database_url(BENCH_DATABASE_SUFFIX)
    if not options.keep_database:
        recreate_database(url)
    os.environ["DATABASE_URL"] = url
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    python = sys.executable
    child_environment = {**os.environ, "DATABASE_URL": url}
    count, batch = options.events, options.batch_size
    print(f"outbox benchmark: {count} events of {PAYLOAD_BYTES} B, batch {batch}, {KEYS} keys")
    database = settings.DATABASES["default"]["NAME"]
    print(f"database {database}, Kafka {settings.KAFKA_BOOTSTRAP_SERVERS}")

    topics = [create_topic() for _ in range(6)]
    try:
        drain = measure_drain(topics[0], count, batch)
        blocked_claim = measure_claim_behind_backlog(topics[0], 100_000, 1_000, batch)
        producer = measure_producer(topics[1], count)
        relay = measure_relay(topics[2], count, batch, transactional=False)
        transactional = measure_relay(topics[3], count, batch, transactional=True)
        print()
        print(f"{'raw SQL drain (claim + mark, no Kafka)':<44}{drain:>10,.0f} events/s")
        print(f"{'raw confluent-kafka producer':<44}{producer:>10,.0f} events/s")
        print(f"{'relay':<44}{relay:>10,.0f} events/s")
        print(f"{'relay, transactional mode':<44}{transactional:>10,.0f} events/s")
        print(f"{'relay / drain':<44}{relay / drain:>10.2f}")
        print(f"{'relay / producer':<44}{relay / producer:>10.2f}")
        print(f"{'transactional / plain relay':<44}{transactional / relay:>10.2f}")
        print(
            f"{'claim behind 100,000 events on 1,000 keys':<44}{blocked_claim:>10.0f} ms"
            "  (their next events held by another relay)"
        )

        if options.rates_only:
            return
        print()
        print(
            f"publish lag at {options.lag_rate} events/s offered for {options.lag_seconds:.0f} s:"
        )
        relay_process = start(
            [python, "manage.py", "outbox_relay", "--poll-seconds", "1"], child_environment
        )
        time.sleep(3)
        warm_up(topics[4])
        offered = offer_load(topics[4], options.lag_rate, options.lag_seconds)
        p50, p99, worst, missing = lag_percentiles(topics[4])
        stop(relay_process)
        report_lag("outbox_relay (LISTEN/NOTIFY)", offered, p50, p99, worst, missing)

        beat_environment = {
            **child_environment,
            "OUTBOX_NUDGE_ON_COMMIT": "true",
            "OUTBOX_RELAY_INTERVAL": "1",
        }
        worker = start(
            [
                python,
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                "--concurrency",
                "2",
                "-Q",
                "celery",
            ],
            beat_environment,
        )
        beat = start(
            [
                python,
                "-m",
                "celery",
                "-A",
                "project",
                "beat",
                "-s",
                str(BASE_DIR / ".local" / "outbox-bench-beat"),
            ],
            beat_environment,
        )
        time.sleep(8)
        settings.OUTBOX_NUDGE_ON_COMMIT = True
        warm_up(topics[5])
        offered = offer_load(topics[5], options.lag_rate, options.lag_seconds)
        settings.OUTBOX_NUDGE_ON_COMMIT = False
        p50, p99, worst, missing = lag_percentiles(topics[5])
        stop(beat)
        stop(worker)
        report_lag("Celery beat (1 s) + nudge", offered, p50, p99, worst, missing)
    finally:
        delete_topics(topics)


if __name__ == "__main__":
    main()
