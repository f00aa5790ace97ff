"""Console benchmark: 1M outbox rows and 1M inbox rows in a database of their own, then the
p50/p95 of admin list pages, API list calls and the dashboard, rendered in-process by Django's
test client (no network, no browser: the server's time only). The outbox events come with what
the relay records of them (delivery records, held set, cursor): 96% DONE, 2% FAILED, 2%
PENDING.

    .venv/bin/python benchmarks/console_bench.py [--rows 1000000] [--runs 30] [--regenerate]
        [--bulk-rows 100000] [--skip-pages]

Then a failure-group retry of --bulk-rows inbox messages (a group of their own, added for the
run and deleted after it): submitted as an operator does (the group's retry-matching page, with
a reason), run by the bulk operation's task in a thread of this process (the worker), while the
operation's progress page is read; it prints the time to finish and the progress seen mid-run.

The rows go into the database `<dev database>_console_bench` (created if missing), never the
development database. Generation is set-based SQL (generate_series), about a minute per
million rows; an existing data set of the right size is reused.
"""

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from benchmarks.databases import database_name, ensure_database, sibling_database_url  # noqa: E402

BENCH_SUFFIX = "_console_bench"

# Event n is about aggregate (and key) agg-(n % KEYS). A key's state shows on its last event
# (the newest KEYS events): one key in ten has a head whose attempts are spent (FAILED, held),
# one in ten an event the relay has not read yet (PENDING, after its cursor); every other
# event was published. With the default 1M rows: 96% DONE, 2% FAILED, 2% PENDING.
KEYS = 200_000
BENCH_RELAY = "console-bench"
ERRORS = (
    "MSG_TIMED_OUT: Local: Message timed out",
    "MSG_SIZE_TOO_LARGE: Broker: Message size too large",
    "UNKNOWN_TOPIC_OR_PART: Broker: Unknown topic",
)

# Events in commit order by n, spread over the week before now. %(unsent)s: only the events
# the relay has not read yet, or only the others.
OUTBOX_SQL = """
INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic, key,
    created_at)
SELECT gen_random_uuid(),
       'agg' || (n %% 5),
       'agg-' || (n %% %(keys)s),
       'Event' || (n %% 10),
       jsonb_build_object('number', n, 'order', 'order-' || n, 'amount', n %% 1000,
                          'note', repeat('x', 120)),
       '{"tenant": "acme"}'::jsonb,
       'bench.topic' || (n %% 5),
       'agg-' || (n %% %(keys)s),
       now() - ((%(rows)s - n) * interval '1 second') * (604800.0 / %(rows)s)
FROM generate_series(1, %(rows)s) AS n
WHERE (n > %(rows)s - %(keys)s AND n %% 10 = 1) = %(unsent)s
ORDER BY n
"""

# What the relay recorded of the events read so far: the failed heads' tries and their place
# in the held set; a PUBLISHED record for every other event. Run in one transaction.
DELIVERY_SQL = (
    """
    CREATE TEMPORARY TABLE bench_event ON COMMIT DROP AS
    SELECT id, topic, key, txid, position, created_at, n,
           n > %(rows)s - %(keys)s AND n %% 10 = 0 AS failed,
           (%(errors)s::text[])[1 + n %% 3] AS error
    FROM (SELECT *, (payload ->> 'number')::bigint AS n FROM outbox_event) AS event
    """,
    """
    INSERT INTO outbox_delivery (event_id, outcome, published_at, kafka_partition,
        kafka_offset, error, relay)
    SELECT id, 'PUBLISHED', created_at + interval '40 milliseconds', n %% 3, n, '', %(relay)s
    FROM bench_event WHERE NOT failed
    """,
    """
    INSERT INTO outbox_delivery (event_id, outcome, published_at, error, relay)
    SELECT id, 'FAILED', created_at + try * interval '1 second', error, %(relay)s
    FROM bench_event CROSS JOIN generate_series(1, %(attempts)s) AS try
    WHERE failed
    """,
    """
    INSERT INTO outbox_held_event (event_id, shard, topic, key, transaction_id, position,
        event_transaction_id, event_position, attempts, next_attempt_at, last_error, held_at)
    SELECT id, {shard}, topic, key, txid::text::bigint, position, txid::text::bigint, position,
           %(attempts)s, NULL, error,
           created_at + %(attempts)s * interval '1 second'
    FROM bench_event WHERE failed
    """,
)

# The relay's cursor, at a tick taken after the events above committed: it has read them all.
CURSOR_SQL = """
WITH tick AS (INSERT INTO outbox_tick (snapshot) VALUES (pg_current_snapshot()) RETURNING id)
INSERT INTO outbox_relay_cursor (shards, tick_id, txid, position, relay)
SELECT %(shards)s::smallint[], tick.id, '0'::xid8, 0, %(relay)s FROM tick
"""

INBOX_SQL = """
INSERT INTO inbox_message (event_id, consumer_group, topic, "partition", "offset", key,
    event_type, aggregate_type, aggregate_id, payload, headers, raw_value, raw_value_encoding,
    status, attempts, next_attempt_at, last_error, published_at, received_at, processed_at,
    duplicate_count, last_duplicate_at)
SELECT gen_random_uuid()::text,
       CASE WHEN n %% 2 = 0 THEN 'billing' ELSE 'shipping' END,
       'bench.topic' || (n %% 5), n %% 3, n, 'agg-' || (n %% 200000), 'Event' || (n %% 10),
       'agg' || (n %% 5), 'agg-' || (n %% 200000),
       jsonb_build_object('number', n, 'note', repeat('y', 120)), '{}'::jsonb, '', '',
       CASE WHEN n %% 100 = 0 THEN 'FAILED' WHEN n %% 100 = 1 THEN 'PENDING' ELSE 'DONE' END,
       1, CASE WHEN n %% 100 = 1 THEN received + interval '1 hour' END,
       CASE WHEN n %% 100 = 0 THEN 'bench.errors.HandlerError: boom' ELSE '' END,
       received - interval '50 milliseconds', received,
       CASE WHEN n %% 100 > 1 THEN received + interval '5 milliseconds' END,
       CASE WHEN n %% 200 = 3 THEN 1 ELSE 0 END,
       CASE WHEN n %% 200 = 3 THEN received END
FROM (
    SELECT n, now() - (n * interval '1 second') * (604800.0 / %(rows)s) AS received
    FROM generate_series(1, %(rows)s) AS n
) AS series
"""


def _generate(rows: int, regenerate: bool) -> None:
    from django.db import connection, transaction

    from outbox.conf import outbox_settings
    from outbox.services.event_log import ALL_SHARDS, SHARD_SQL, event_log_start_afresh

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM outbox_event")
        outbox_rows = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM inbox_message")
        inbox_rows = cursor.fetchone()[0]
        # Data written by this script, not rows an earlier version's migrations converted.
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM outbox_relay_cursor WHERE relay = %s)", [BENCH_RELAY]
        )
        ours = cursor.fetchone()[0]
    if not regenerate and ours and outbox_rows == rows and inbox_rows == rows:
        print(f"reusing {outbox_rows} outbox rows and {inbox_rows} inbox rows")
        return
    parameters = {
        "rows": rows,
        "keys": KEYS,
        "relay": BENCH_RELAY,
        "errors": list(ERRORS),
        "attempts": outbox_settings.MAX_ATTEMPTS,
        "shards": list(ALL_SHARDS),
    }
    # Each statement commits on its own (autocommit), so the cursor's tick sees the events
    # read and not those written after it.
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE outbox_event, inbox_message")
        event_log_start_afresh()
        started = time.perf_counter()
        cursor.execute(OUTBOX_SQL, {**parameters, "unsent": False})
        with transaction.atomic():
            for statement in DELIVERY_SQL:
                cursor.execute(statement.format(shard=SHARD_SQL.format(key="key")), parameters)
        cursor.execute(CURSOR_SQL, parameters)
        cursor.execute(OUTBOX_SQL, {**parameters, "unsent": True})
        print(
            f"generated {rows} outbox rows with their delivery records "
            f"in {time.perf_counter() - started:.0f} s"
        )
        started = time.perf_counter()
        cursor.execute(INBOX_SQL, {"rows": rows})
        print(f"generated {rows} inbox rows in {time.perf_counter() - started:.0f} s")
    # Outside a transaction: VACUUM sets the visibility map, so count queries can be index-only.
    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit = True
    with raw.cursor() as cursor:
        started = time.perf_counter()
        for table in ("outbox_event", "outbox_delivery", "outbox_held_event", "inbox_message"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        print(f"vacuum analyze in {time.perf_counter() - started:.0f} s")


BULK_GROUP = "bench-bulk"
BULK_SQL = """
INSERT INTO inbox_message (event_id, consumer_group, topic, "partition", "offset", key,
    event_type, aggregate_type, aggregate_id, payload, headers, raw_value, raw_value_encoding,
    status, attempts, next_attempt_at, last_error, published_at, received_at, processed_at,
    duplicate_count)
SELECT gen_random_uuid()::text, %(group)s, 'bench.bulk', 0, n, 'bulk-' || n, 'BulkEvent',
       'agg', 'bulk-' || n, '{}'::jsonb, '{}'::jsonb, '', '', 'FAILED', 5, NULL,
       'bench.errors.QuotaExceeded: over quota', now() - interval '1 minute',
       now() - interval '1 minute', NULL, 0
FROM generate_series(1, %(rows)s) AS n
"""


def _delete_bulk_rows() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM inbox_message WHERE consumer_group = %s", [BULK_GROUP])


def _bench_failure_group_retry(client: Any, rows: int) -> bool:
    """Retries a failure group of `rows` inbox messages through the admin, with the task run
    by a thread; returns whether it finished within 60 s with progress seen mid-run."""
    import threading

    from django.conf import settings
    from django.db import connection

    from console import tasks
    from console.bulk_operations import bulk_operation_run
    from console.models import BulkOperation

    _delete_bulk_rows()
    with connection.cursor() as cursor:
        cursor.execute(BULK_SQL, {"group": BULK_GROUP, "rows": rows})
        cursor.execute("ANALYZE inbox_message")
    workers: list[threading.Thread] = []

    def worker(operation_id: int) -> None:
        try:
            bulk_operation_run(operation_id=operation_id)
        finally:
            connection.close()  # the thread's own connection

    def start_worker(operation_id: int) -> None:
        thread = threading.Thread(target=worker, args=(operation_id,))
        workers.append(thread)
        thread.start()

    # No broker round trip: a worker of another project must never get this database's id.
    tasks.run_bulk_operation.delay = start_worker  # type: ignore[method-assign,assignment]
    query = (
        f"status__exact=FAILED&consumer_group={BULK_GROUP}&topic=bench.bulk"
        "&error_class=bench.errors.QuotaExceeded"
    )
    base = "/admin/inbox/inboxmessage/"
    confirm = client.get(f"{base}retry-matching/?{query}")
    assert confirm.status_code == 200, confirm.status_code
    started = time.perf_counter()
    response = client.post(
        f"{base}retry-matching/",
        {"_changelist_filters": query, "reason": "console bench: quota raised"},
    )
    submitted = time.perf_counter() - started
    assert response.status_code == 302, response.content[:300]
    progress_url = response.url
    operation = BulkOperation.objects.latest("created_at")
    seen: list[tuple[float, int, int]] = []
    while True:
        page = client.get(progress_url)
        assert page.status_code == 200
        operation.refresh_from_db()
        seen.append((time.perf_counter() - started, operation.chunks_done, operation.rows_changed))
        if operation.is_finished:
            break
        time.sleep(1.0)
    for thread in workers:
        thread.join()
    took = time.perf_counter() - started
    mid_run = [entry for entry in seen if 0 < entry[1] < operation.chunks_total]
    print(
        f"\nfailure-group retry of {rows} inbox messages, chunks of "
        f"{settings.CONSOLE_BULK_CHUNK_SIZE}, cap {settings.CONSOLE_BULK_MAX_ROWS_PER_SECOND} "
        f"rows/s: submit (freeze ids, store chunks) {submitted:.1f} s; {operation.status} after "
        f"{took:.1f} s, {operation.chunks_done}/{operation.chunks_total} chunks, "
        f"{operation.rows_changed} rows changed"
    )
    print(
        f"progress page read {len(seen)} times; mid-run readings (s, chunks, rows changed): "
        + ", ".join(f"({at:.0f}, {chunks}, {changed})" for at, chunks, changed in mid_run[:8])
        + (" ..." if len(mid_run) > 8 else "")
    )
    ok = operation.status == BulkOperation.Status.DONE and took <= 60 and bool(mid_run)
    print(f"target: done in <= 60 s with progress visible mid-run: {'ok' if ok else 'MISSED'}")
    _delete_bulk_rows()
    return ok


def _nothing() -> None:
    pass


def _measure(
    client: Any, url: str, runs: int, before_each: Callable[[], None] = _nothing
) -> tuple[float, float, float]:
    response = client.get(url)  # warm-up (and a check)
    if response.status_code != 200:
        raise SystemExit(f"{url} answered {response.status_code}: {response.content[:500]!r}")
    timings = []
    for _ in range(runs):
        before_each()
        started = time.perf_counter()
        response = client.get(url)
        timings.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, url
    timings.sort()
    p95 = timings[min(len(timings) - 1, round(0.95 * len(timings)) - 1)]
    return statistics.median(timings), p95, timings[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--bulk-rows", type=int, default=100_000)
    parser.add_argument("--skip-pages", action="store_true", help="only the bulk retry")
    arguments = parser.parse_args()

    url = sibling_database_url(BENCH_SUFFIX)
    if ensure_database(url):
        print(f"created database {database_name(url)}")
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")
    os.environ["DEBUG"] = "false"  # no query log in memory
    os.environ["ALLOWED_HOSTS"] = "testserver,localhost"
    os.environ["OUTBOX_NUDGE_ON_COMMIT"] = "false"

    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    _delete_bulk_rows()  # left by an interrupted run: the counts below would not match
    _generate(arguments.rows, arguments.regenerate)
    from console.selectors import status_counts
    from outbox.models import OutboxEvent

    print(f"outbox events as the console counts them: {status_counts(OutboxEvent).counts}")
    user, _ = get_user_model().objects.get_or_create(username="console-bench")
    user.is_staff = user.is_superuser = True
    user.save()
    client = Client()
    client.force_login(user)

    with django.db.connection.cursor() as cursor:
        cursor.execute(
            "SELECT event_id FROM outbox_held_event "
            "WHERE next_attempt_at IS NULL AND attempts > 0 LIMIT 1"
        )
        failed_id = cursor.fetchone()[0]
    api_second_page = client.get("/api/outbox/events/?status=DONE").json()["next"]
    cases = [
        ("admin", "outbox list, unfiltered", "/admin/outbox/outboxevent/"),
        ("admin", "outbox list, status=FAILED", "/admin/outbox/outboxevent/?status__exact=FAILED"),
        ("admin", "outbox list, event type", "/admin/outbox/outboxevent/?event_type=Event3"),
        (
            "admin",
            "outbox list, topic + status",
            "/admin/outbox/outboxevent/?topic=bench.topic2&status__exact=PENDING",
        ),
        ("admin", "outbox list, search aggregate id", "/admin/outbox/outboxevent/?q=agg-4242"),
        ("admin", "outbox list, rare event type", "/admin/outbox/outboxevent/?event_type=Rare"),
        ("admin", "outbox list, page 200", "/admin/outbox/outboxevent/?p=200"),
        ("admin", "outbox detail + timeline", f"/admin/outbox/outboxevent/{failed_id}/change/"),
        ("admin", "inbox list, unfiltered", "/admin/inbox/inboxmessage/"),
        ("admin", "inbox list, status=FAILED", "/admin/inbox/inboxmessage/?status__exact=FAILED"),
        ("admin", "inbox list, group", "/admin/inbox/inboxmessage/?consumer_group=billing"),
        ("admin", "inbox list, search aggregate id", "/admin/inbox/inboxmessage/?q=agg-4242"),
        ("admin", "inbox list, rare event type", "/admin/inbox/inboxmessage/?event_type=Rare"),
        ("api", "outbox events", "/api/outbox/events/"),
        ("api", "outbox events, status=FAILED", "/api/outbox/events/?status=FAILED"),
        ("api", "outbox events, event type", "/api/outbox/events/?event_type=Event3"),
        ("api", "outbox events, next page", api_second_page),
        ("api", "inbox messages", "/api/inbox/messages/"),
        ("api", "inbox messages, status=FAILED", "/api/inbox/messages/?status=FAILED"),
        ("api", "inbox messages, group", "/api/inbox/messages/?consumer_group=shipping"),
        ("api", "inbox messages, rare event type", "/api/inbox/messages/?event_type=Rare"),
        ("api", "outbox events, rare event type", "/api/outbox/events/?event_type=Rare"),
        ("api", "stats summary", "/api/stats/summary/"),
        ("dashboard", "admin dashboard", "/admin/"),
    ]
    # The dashboard caches its slower reads (CONSOLE_DASHBOARD_CACHE_SECONDS, Kafka's lag
    # CONSOLE_KAFKA_CACHE_SECONDS); an operator who refreshes less often than that always
    # meets them cold, so the cold page has the same target.
    from django.core.cache import cache

    cold_cases = {"admin dashboard, caches cold": cache.clear}
    cases.append(("dashboard", "admin dashboard, caches cold", "/admin/"))
    targets = {"admin": 300.0, "api": 300.0, "dashboard": 500.0}
    print(
        f"\n{arguments.rows} outbox + {arguments.rows} inbox rows in "
        f"{settings.DATABASES['default']['NAME']}; {arguments.runs} runs per page (ms)"
    )
    # Timings are CPU-bound (template rendering): a loaded machine slows every page alike.
    print(f"load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"{'kind':<10} {'page':<36} {'p50':>8} {'p95':>8} {'max':>8}  target")
    failures = 0
    for kind, name, path in [] if arguments.skip_pages else cases:
        p50, p95, worst = _measure(client, path, arguments.runs, cold_cases.get(name, _nothing))
        ok = p95 <= targets[kind]
        failures += not ok
        print(
            f"{kind:<10} {name:<36} {p50:8.1f} {p95:8.1f} {worst:8.1f}  "
            f"p95 <= {targets[kind]:.0f} {'ok' if ok else 'MISSED'}"
        )
    print(f"load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    if arguments.bulk_rows:
        failures += not _bench_failure_group_retry(client, arguments.bulk_rows)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
