"""Console benchmark: 1M outbox rows and 1M inbox rows in a database of their own, then the
p50/p95 of admin list pages, API list calls and the dashboard, rendered in-process by Django's
test client (no network, no browser: the server's time only).

    .venv/bin/python benchmarks/console_bench.py [--rows 1000000] [--runs 30] [--regenerate]

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

OUTBOX_SQL = """
INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic, key,
    status, attempts, next_attempt_at, last_error, created_at, published_at, kafka_partition,
    kafka_offset, updated_at, discarded_at, locked_until, locked_by)
SELECT gen_random_uuid(),
       'agg' || (n %% 5),
       'agg-' || (n %% 200000),
       'Event' || (n %% 10),
       jsonb_build_object('number', n, 'order', 'order-' || n, 'amount', n %% 1000,
                          'note', repeat('x', 120)),
       '{"tenant": "acme"}'::jsonb,
       'bench.topic' || (n %% 5),
       'agg-' || (n %% 200000),
       CASE WHEN n %% 50 = 0 THEN 'FAILED' WHEN n %% 50 = 1 THEN 'PENDING' ELSE 'DONE' END,
       CASE WHEN n %% 50 = 0 THEN 10 WHEN n %% 50 = 1 THEN 0 ELSE 1 END,
       created,
       CASE WHEN n %% 50 = 0 THEN
            (ARRAY['MSG_TIMED_OUT: Local: Message timed out',
                   'MSG_SIZE_TOO_LARGE: Broker: Message size too large',
                   'UNKNOWN_TOPIC_OR_PART: Broker: Unknown topic'])[1 + n %% 3]
            ELSE '' END,
       created,
       CASE WHEN n %% 50 > 1 THEN created + interval '40 milliseconds' END,
       CASE WHEN n %% 50 > 1 THEN n %% 3 END,
       CASE WHEN n %% 50 > 1 THEN n END,
       created, NULL, NULL, ''
FROM (
    SELECT n, now() - (n * interval '1 second') * (604800.0 / %(rows)s) AS created
    FROM generate_series(1, %(rows)s) AS n
) AS series
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
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM outbox_event")
        outbox_rows = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM inbox_message")
        inbox_rows = cursor.fetchone()[0]
    if not regenerate and outbox_rows == rows and inbox_rows == rows:
        print(f"reusing {outbox_rows} outbox rows and {inbox_rows} inbox rows")
        return
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE outbox_event, inbox_message")
        started = time.perf_counter()
        cursor.execute(OUTBOX_SQL, {"rows": rows})
        print(f"generated {rows} outbox rows in {time.perf_counter() - started:.0f} s")
        started = time.perf_counter()
        cursor.execute(INBOX_SQL, {"rows": rows})
        print(f"generated {rows} inbox rows in {time.perf_counter() - started:.0f} s")
    # Outside a transaction: VACUUM sets the visibility map, so count queries can be index-only.
    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit = True
    with raw.cursor() as cursor:
        started = time.perf_counter()
        cursor.execute("VACUUM ANALYZE outbox_event")
        cursor.execute("VACUUM ANALYZE inbox_message")
        print(f"vacuum analyze in {time.perf_counter() - started:.0f} s")


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
    _generate(arguments.rows, arguments.regenerate)
    user, _ = get_user_model().objects.get_or_create(username="console-bench")
    user.is_staff = user.is_superuser = True
    user.save()
    client = Client()
    client.force_login(user)

    with django.db.connection.cursor() as cursor:
        cursor.execute("SELECT id FROM outbox_event WHERE status = 'FAILED' LIMIT 1")
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
    for kind, name, path in cases:
        p50, p95, worst = _measure(client, path, arguments.runs, cold_cases.get(name, _nothing))
        ok = p95 <= targets[kind]
        failures += not ok
        print(
            f"{kind:<10} {name:<36} {p50:8.1f} {p95:8.1f} {worst:8.1f}  "
            f"p95 <= {targets[kind]:.0f} {'ok' if ok else 'MISSED'}"
        )
    print(f"load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
