"""Reads for the console across apps (dashboard, stats API, /metrics, an event's timeline),
each cheap on tables of millions of rows: exact counts only where an index keeps them small,
estimates elsewhere, and Kafka calls with a short timeout whose failure is a state to show,
never an error page."""

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.db.models import BooleanField, CharField, Count, Max, Model, Q, QuerySet, Sum
from django.db.models.expressions import RawSQL
from django.utils import timezone

from console.consumer_lag import ConsumerLag
from inbox.models import InboxMessage
from kafka_events.errors import error_class_of
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.selectors import (
    FEW_EVENTS,
    LogBacklog,
    outbox_event_records,
    outbox_events_among,
    outbox_last_published_at,
    outbox_log_backlog,
    outbox_log_done_count,
    outbox_oldest_pending_age_seconds,
)
from outbox.services.event_log.deliveries import RECORD_CLOCK_MARGIN

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Above this many rows (PostgreSQL's estimate), the DONE count is estimated rather than counted.
EXACT_DONE_COUNT_MAX_ROWS = 200_000


def event_consumers(*, event_id: uuid.UUID | str) -> QuerySet[InboxMessage]:
    """An outbox event's timeline across consumer groups: its inbox rows, in the order they
    were received, without their heavy columns."""
    return (
        InboxMessage.objects.filter(event_id=str(event_id))
        .defer("payload", "headers", "raw_value")
        .order_by("received_at")
    )


def table_row_estimate(table: str) -> int:
    """PostgreSQL's planner estimate of a table's rows (pg_class.reltuples), -1 if unknown."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table]
        )
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else -1


def rows_counted_up_to(queryset: QuerySet, *, limit: int) -> int:
    """The rows `queryset` matches, counted no further than `limit` + 1: a count that tells
    "more than `limit`" without scanning millions of rows."""
    return int(queryset.order_by().values("pk")[: limit + 1].count())


@dataclass(frozen=True)
class StatusCounts:
    counts: dict[str, int]
    # DONE is PostgreSQL's estimate of the table minus the exact counts of the other statuses.
    done_estimated: bool
    # The outbox's counts are read from the relay's backlog, which also has the oldest pending
    # event: read once for both.
    backlog: LogBacklog | None = None


def status_counts(model: type[Model]) -> StatusCounts:
    """Counts by status. The statuses other than DONE (PENDING, FAILED, and the inbox's
    PARKED) are counted exactly (an index keeps them cheap while they are few); DONE, usually
    nearly all rows, is estimated on big tables. The outbox
    is counted from the relay's cursors, delivery records and held set (its rows carry no
    status)."""
    if model is OutboxEvent:
        return _outbox_status_counts()
    table = model._meta.db_table
    manager = model._default_manager
    unfinished = [status for status in model.Status.values if status != "DONE"]  # type: ignore[attr-defined]
    counts = {status: manager.filter(status=status).count() for status in unfinished}
    estimate = table_row_estimate(table)
    if estimate > EXACT_DONE_COUNT_MAX_ROWS:
        counts["DONE"] = max(0, estimate - sum(counts.values()))
        return StatusCounts(counts=counts, done_estimated=True)
    counts["DONE"] = manager.filter(status="DONE").count()
    return StatusCounts(counts=counts, done_estimated=False)


def _outbox_status_counts() -> StatusCounts:
    """PENDING is what the relay has left to send (the events after its cursors without an
    outcome, and the held events not spent), FAILED the held heads whose attempts are spent:
    what waits for an operator. Both are read from the cursors' range of the txid index and
    the small held set; DONE is counted only while the event and delivery tables are small.
    Discarded events are in none of the exact counts (they are found only by reading the
    delivery table) but are in the DONE estimate."""
    backlog = outbox_log_backlog()
    counts = {"PENDING": backlog.unsent + backlog.held_waiting, "FAILED": backlog.held_spent}
    estimate = table_row_estimate(OutboxEvent._meta.db_table)
    records = table_row_estimate(OutboxDelivery._meta.db_table)
    if max(estimate, records) > EXACT_DONE_COUNT_MAX_ROWS:
        counts["DONE"] = max(0, estimate - counts["PENDING"] - counts["FAILED"])
        return StatusCounts(counts=counts, done_estimated=True, backlog=backlog)
    counts["DONE"] = outbox_log_done_count()
    return StatusCounts(counts=counts, done_estimated=False, backlog=backlog)


@dataclass(frozen=True)
class RateSeries:
    labels: list[str]
    published: list[int]
    consumed: list[int]


def _bucket_counts(
    table: str, column: str, *, since: datetime, bucket: str, also: str = ""
) -> dict[datetime, int]:
    # Only the range of one index (published_at / processed_at) is read; `also` is a further
    # condition, a constant.
    condition = f" AND {also}" if also else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT date_bin(%s::interval, {column}, %s) AS bucket, count(*) "  # noqa: S608
            f"FROM {table} WHERE {column} >= %s{condition} GROUP BY 1",
            [bucket, since, since],
        )
        return {row[0]: row[1] for row in cursor.fetchall()}


def _published_bucket_counts(*, since: datetime, bucket: str) -> dict[datetime, int]:
    # The relay's publications are its PUBLISHED records, found through the BRIN index on
    # their published_at (outbox_delivery_published_brin).
    return _bucket_counts(
        "outbox_delivery",
        "published_at",
        since=since,
        bucket=bucket,
        also="outcome = 'PUBLISHED'",
    )


def rate_series(*, period: timedelta, bucket: timedelta) -> RateSeries:
    """Events published (outbox) and messages processed (inbox) per bucket over the period."""
    now = timezone.now()
    buckets = int(period / bucket)
    start = now - bucket * buckets
    # Buckets aligned to whole bucket lengths since the epoch, so they read like a clock.
    epoch = datetime(2000, 1, 1, tzinfo=now.tzinfo)
    start = epoch + bucket * ((start - epoch) // bucket)
    interval = f"{int(bucket.total_seconds())} seconds"
    published = _published_bucket_counts(since=start, bucket=interval)
    consumed = _bucket_counts("inbox_message", "processed_at", since=start, bucket=interval)
    slots = [start + bucket * index for index in range(buckets + 1)]
    label_format = "%H:%M" if bucket < timedelta(hours=1) else "%d %H:00"
    return RateSeries(
        labels=[slot.strftime(label_format) for slot in slots],
        published=[published.get(slot, 0) for slot in slots],
        consumed=[consumed.get(slot, 0) for slot in slots],
    )


# Failures by class are read from the latest FAILED rows of each side, so the card stays cheap
# however many rows have failed: the inbox's are found by walking it by receipt time (the
# outbox's are its held heads, a small set), and with 2% of a million rows FAILED, 1,000 of
# them cost a fifth of what 5,000 did.
FAILURE_SAMPLE_ROWS = 1000


def failures_by_error_class(*, limit: int = 10) -> list[dict[str, Any]]:
    """FAILED rows by the class of their last error (the text before ':'), among the latest
    FAILURE_SAMPLE_ROWS FAILED rows of the outbox and of the inbox that no operator discarded.
    The outbox's FAILED rows are the held heads whose attempts are spent, the latest held
    first."""
    error_class = ERROR_CLASS_SQL
    # Composed of constants only.
    outbox_failed = (
        f"SELECT 'outbox' AS side, {error_class} AS error_class "  # noqa: S608
        "FROM outbox_held_event WHERE next_attempt_at IS NULL AND attempts > 0 "
        "ORDER BY id DESC LIMIT %(sample)s"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT side, error_class, count(*) FROM (
                ({outbox_failed})
                UNION ALL
                (SELECT 'inbox', {error_class} FROM inbox_message
                 WHERE status = 'FAILED' AND discarded_at IS NULL
                 ORDER BY received_at DESC LIMIT %(sample)s)
            ) AS failed
            GROUP BY 1, 2 ORDER BY 3 DESC LIMIT %(limit)s
            """,  # noqa: S608
            {"sample": FAILURE_SAMPLE_ROWS, "limit": limit},
        )
        return [
            {"side": side, "error_class": error_class or NO_ERROR_TEXT, "count": count}
            for side, error_class, count in cursor.fetchall()
        ]


# How a failure's class is read from its error text: the text before ':' on its first line
# ("MSG_SIZE_TOO_LARGE: ...", "ValueError: ..."), as the dashboard, the failure groups and the
# outbox's attempt history name it. An empty text is its own class.
ERROR_CLASS_OF_SQL = "split_part(split_part({column}, E'\\n', 1), ':', 1)"
ERROR_CLASS_SQL = ERROR_CLASS_OF_SQL.format(column="last_error")
NO_ERROR_TEXT = "(no error text)"
FAILURE_GROUPS_SHOWN = 200


@dataclass(frozen=True)
class FailureGroup:
    """FAILED rows of one side with one error class, on one topic (and consumer group)."""

    error_class: str
    topic: str
    consumer_group: str
    count: int
    first_seen: datetime
    last_seen: datetime
    sample_id: Any
    sample_error: str


def failure_groups(side: str) -> list[FailureGroup]:
    """Every FAILED row no operator discarded, grouped by error class and topic (and group,
    for the inbox): the largest groups first, at most FAILURE_GROUPS_SHOWN. The outbox's are
    its held heads whose attempts are spent (first and last seen: when they began to hold
    their keys); the inbox's its FAILED messages (when the first and the last were
    received)."""
    if side == "outbox":
        sql = f"""
            SELECT {ERROR_CLASS_SQL}, topic, '', count(*), min(held_at), max(held_at),
                   (array_agg(event_id ORDER BY held_at DESC))[1],
                   (array_agg(last_error ORDER BY held_at DESC))[1]
            FROM outbox_held_event WHERE next_attempt_at IS NULL AND attempts > 0
            GROUP BY 1, 2 ORDER BY 4 DESC, 1, 2 LIMIT %(limit)s
        """  # noqa: S608  (constants only)
    elif side == "inbox":
        sql = f"""
            SELECT {ERROR_CLASS_SQL}, topic, consumer_group, count(*), min(received_at),
                   max(received_at), (array_agg(id ORDER BY received_at DESC))[1],
                   (array_agg(last_error ORDER BY received_at DESC))[1]
            FROM inbox_message WHERE status = 'FAILED' AND discarded_at IS NULL
            GROUP BY 1, 2, 3 ORDER BY 4 DESC, 1, 2, 3 LIMIT %(limit)s
        """  # noqa: S608  (constants only)
    else:
        raise ValueError(f"no such side: {side!r}")
    with connection.cursor() as cursor:
        cursor.execute(sql, {"limit": FAILURE_GROUPS_SHOWN})
        rows = cursor.fetchall()
    return [
        FailureGroup(
            error_class=error_class or NO_ERROR_TEXT,
            topic=topic,
            consumer_group=group,
            count=count,
            first_seen=first,
            last_seen=last,
            sample_id=sample_id,
            sample_error=sample_error or "",
        )
        for error_class, topic, group, count, first, last, sample_id, sample_error in rows
    ]


def failure_group_count(
    side: str, *, error_class: str, topic: str, consumer_group: str = ""
) -> int:
    """The rows of one failure group now, counted as failure_groups counts them (the held
    heads of the outbox, the inbox's messages): 0 when no such group is left."""
    return _failure_group_members(
        side, error_class=error_class, topic=topic, consumer_group=consumer_group
    ).count()


def _failure_group_members(
    side: str, *, error_class: str, topic: str, consumer_group: str
) -> QuerySet:
    """The rows failure_groups groups, of one group: the held heads whose attempts are spent
    (outbox) or the FAILED messages no operator discarded (inbox)."""
    rows: QuerySet[Any]
    if side == "outbox":
        rows = OutboxHeldEvent.objects.filter(
            next_attempt_at__isnull=True, attempts__gt=0, topic=topic
        )
    elif side == "inbox":
        rows = InboxMessage.objects.filter(
            status=InboxMessage.Status.FAILED,
            discarded_at__isnull=True,
            topic=topic,
            consumer_group=consumer_group,
        )
    else:
        raise ValueError(f"no such side: {side!r}")
    # ERROR_CLASS_SQL names its column unqualified: inside the held set's subquery (the events
    # failure_group_rows finds by place) it reads the held row's error, the only table of that
    # scope with the column.
    rows = rows.alias(failure_class=RawSQL(ERROR_CLASS_SQL, ()))  # noqa: S611 (a constant)
    if error_class == NO_ERROR_TEXT:
        rows = rows.filter(Q(failure_class="") | Q(failure_class__isnull=True))
    else:
        rows = rows.filter(failure_class=error_class)
    return rows


def failure_group_rows(
    side: str, *, error_class: str, topic: str, consumer_group: str = ""
) -> QuerySet:
    """The rows of one failure group, as failure_groups counts them (the same FAILED rows, the
    same reading of the error class): outbox events (by the held heads whose attempts are
    spent) or inbox messages, for a bulk action to freeze. Empty when no such group is left."""
    rows = _failure_group_members(
        side, error_class=error_class, topic=topic, consumer_group=consumer_group
    )
    if side == "outbox":
        # The events by their places, through the event table's (txid, position) index, as
        # the relay finds a held event: by id (a BRIN index) each would be a scan of ranges.
        places, params = (
            rows.order_by().values("event_transaction_id", "event_position").query.sql_with_params()
        )
        # Django's own SQL of the held rows; the group's values stay parameters.
        select = f"SELECT txid::text::xid8, position FROM ({places}) AS place(txid, position)"  # noqa: S608
        sql = f'("outbox_event"."txid", "outbox_event"."position") IN ({select})'
        in_group = RawSQL(sql, params, output_field=BooleanField())  # noqa: S611
        return OutboxEvent.objects.filter(in_group)
    return rows


def outbox_event_attempts(event: OutboxEvent) -> QuerySet[OutboxDelivery]:
    """The delivery records of `event`, oldest first (outbox_event_records), each with the
    class of its error as `error_class`: read from the error text, as ERROR_CLASS_SQL reads
    it, not stored (empty for a published or discarded record, whose error is empty)."""
    error_class = ERROR_CLASS_OF_SQL.format(column='"outbox_delivery"."error"')
    return outbox_event_records(event).annotate(
        error_class=RawSQL(error_class, (), output_field=CharField())  # noqa: S611 (a constant)
    )


def error_class_condition(error_class: str, *, field: str = "last_error") -> Q:
    """Rows whose error text (in `field`) is of `error_class` (see ERROR_CLASS_SQL)."""
    if error_class == NO_ERROR_TEXT:
        return Q(**{field: ""}) | Q(**{f"{field}__isnull": True})
    return (
        Q(**{field: error_class})
        | Q(**{f"{field}__startswith": f"{error_class}:"})
        | Q(**{f"{field}__startswith": f"{error_class}\n"})
    )


def rows_of_error_class(rows: QuerySet, error_class: str, *, field: str) -> QuerySet:
    """The rows of `rows` whose error text (in `field`) is of `error_class`: inbox messages by
    their last_error, or outbox events (annotated by outbox_events_with_delivery) by their
    delivery_error. "No error text" matches most rows: the list reads the newest first. A
    class is found through an index of the rows with an error, by class
    (kafka_events.errors.error_class_of), never by reading every row's error."""
    if error_class == NO_ERROR_TEXT:
        return rows.filter(error_class_condition(error_class, field=field))
    if rows.model is OutboxEvent:
        return _outbox_events_of_error_class(rows, error_class)
    # inbox_message_error_class_idx: the rows whose error is not empty, by class.
    return (
        rows.alias(row_error_class=error_class_of(field))
        .filter(row_error_class=error_class)
        .exclude(**{field: ""})
    )


def _outbox_events_of_error_class(events: QuerySet, error_class: str) -> QuerySet:
    """The events whose delivery_error (the held head's error, else the latest failed try's)
    is of `error_class`. Such an event has a failed try of that class
    (outbox_delivery_errclass_idx) or is held with such an error (the held set is small). A
    few: those events, by id (outbox_events_among). Many: the list, newest first, from the
    creation of the newest event they can be (before the latest such try) on."""
    in_class = events.filter(error_class_condition(error_class, field="delivery_error"))
    tries = (
        OutboxDelivery.objects.filter(outcome=OutboxDelivery.Outcome.FAILED)
        .alias(try_error_class=error_class_of("error"))
        .filter(try_error_class=error_class)
    )
    held = list(
        OutboxHeldEvent.objects.alias(held_error_class=error_class_of("last_error"))
        .filter(held_error_class=error_class)
        .values_list("event_id", "event_created_at")
    )
    event_ids = list(tries.values_list("event_id", flat=True)[:FEW_EVENTS])
    if len(event_ids) + len(held) < FEW_EVENTS:
        return outbox_events_among(in_class, event_ids + [event_id for event_id, _ in held])
    newest = [created for _, created in held]
    latest_try = tries.aggregate(latest=Max("published_at"))["latest"]
    if latest_try is not None:
        newest.append(latest_try)
    return in_class.filter(created_at__lte=max(newest) + RECORD_CLOCK_MARGIN)


def duplicates_since(since: datetime) -> dict[str, int]:
    """Inbox rows received since `since` that were delivered more than once, and the copies."""
    row = InboxMessage.objects.filter(received_at__gte=since, duplicate_count__gt=0).aggregate(
        messages=Count("id"), copies=Sum("duplicate_count")
    )
    return {"messages": int(row["messages"] or 0), "copies": int(row["copies"] or 0)}


def cached(key: str, compute: Callable[[], T]) -> T:
    """`compute()`, cached for CONSOLE_DASHBOARD_CACHE_SECONDS: the slower reads of the
    dashboard and the stats summary (the outbox's counts, quarantined keys, failures by class,
    the day's rates) need not run on every refresh."""
    seconds = settings.CONSOLE_DASHBOARD_CACHE_SECONDS
    if seconds <= 0:
        return compute()
    full_key = f"console:{key}:{connection.settings_dict['NAME']}"
    value = cache.get(full_key)
    if value is None:
        value = compute()
        cache.set(full_key, value, seconds)
    return value


# --- health of each part --------------------------------------------------------------------

GREEN, AMBER, RED, GREY = "green", "amber", "red", "grey"


@dataclass(frozen=True)
class PartHealth:
    name: str
    colour: str
    detail: str


def _colour_for_age(age: float | None, thresholds: list[float]) -> str:
    if age is None:
        return GREY
    amber, red = thresholds[0], thresholds[1]
    return GREEN if age < amber else AMBER if age < red else RED


def _redis_health() -> PartHealth:
    from console.beat import redis_client

    try:
        # The process's client, as /health/ and the beat tile use: one made per render
        # connected each time.
        redis_client(settings.CELERY_BROKER_URL).ping()
    except (redis.RedisError, OSError, ValueError) as error:
        return PartHealth("Redis", RED, f"unreachable: {error}"[:200])
    return PartHealth("Redis", GREEN, "answers PING")


def _beat_health(now: datetime) -> PartHealth:
    from console.beat import beat_last_tick

    try:
        last_tick = beat_last_tick()
    except (redis.RedisError, OSError) as error:
        return PartHealth("Celery beat", RED, f"heartbeat unreadable: {error}"[:200])
    if last_tick is None:
        return PartHealth("Celery beat", RED, "no heartbeat: not running")
    age = max(0.0, (now - last_tick).total_seconds())
    return PartHealth(
        "Celery beat",
        _colour_for_age(age, settings.CONSOLE_BEAT_STALE_SECONDS),
        f"last tick {age:.0f} s ago",
    )


def health_parts(*, kafka: ConsumerLag, oldest_pending_age: float | None) -> list[PartHealth]:
    now = timezone.now()
    parts = []
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        parts.append(PartHealth("PostgreSQL", GREEN, connection.settings_dict["NAME"]))
    except DatabaseError as error:
        parts.append(PartHealth("PostgreSQL", RED, str(error)[:200]))
    parts.append(
        PartHealth("Kafka", GREEN, "reachable")
        if kafka.reachable
        else PartHealth("Kafka", RED, kafka.error or "unreachable")
    )
    parts.append(_redis_health())
    parts.append(_beat_health(now))
    last_success = outbox_last_published_at()
    # The relay is healthy while nothing waits long, however long ago it last had work.
    colour = (
        GREEN
        if oldest_pending_age is None
        else _colour_for_age(oldest_pending_age, settings.CONSOLE_PENDING_AGE_SECONDS)
    )
    detail = (
        "never published"
        if last_success is None
        else f"last publish {int((now - last_success).total_seconds())} s ago"
    )
    if oldest_pending_age is not None:
        detail += f"; oldest pending {int(oldest_pending_age)} s"
    parts.append(PartHealth("Relay", colour, detail))
    return parts


# --- analytics, when that app provides its selectors -----------------------------------------


def latest_analytics() -> dict[str, Any] | None:
    """The succeeded analytics run over the latest window, with how long ago that window ended,
    or None when analytics is absent or has no run."""
    try:
        from analytics import selectors as analytics_selectors

        with transaction.atomic():
            run = analytics_selectors.analytics_run_latest_window()
    except Exception as error:  # the console works without analytics
        logger.debug("No analytics results: %s", error)
        return None
    if run is None:
        return None
    summary = run.summary if isinstance(run.summary, dict) else {}
    return {
        "window_start": run.window_start,
        "window_end": run.window_end,
        "window_age_seconds": max(0.0, (timezone.now() - run.window_end).total_seconds()),
        "finished_at": run.finished_at,
        "summary": summary,
    }


# Hours of analytics results the dashboard's charts show, and the findings it lists.
ANALYTICS_CHART_HOURS = 48
ANALYTICS_DASHBOARD_FINDINGS = 20


def analytics_dashboard() -> dict[str, Any] | None:
    """The analytics results over the last ANALYTICS_CHART_HOURS hours that have any (lag
    percentiles per stage, duplicate rate) and the latest run's first findings; None when
    analytics is absent or has no results."""
    try:
        from analytics import selectors as analytics_selectors

        with transaction.atomic():
            window = analytics_selectors.analytics_hours(hours=ANALYTICS_CHART_HOURS)
            if window is None:
                return None
            since, until = window
            run = analytics_selectors.analytics_run_latest()
            findings = analytics_selectors.reconciliation_finding_list(run=run)
            return {
                "since": since,
                "until": until,
                "lag": analytics_selectors.delivery_lag_hourly(since=since, until=until),
                "duplicates": analytics_selectors.duplicate_rate_hourly(since=since, until=until),
                "findings": list(findings[:ANALYTICS_DASHBOARD_FINDINGS]),
                "findings_total": run.findings if run is not None else 0,
                "run_id": run.pk if run is not None else None,
            }
    except Exception as error:  # the console works without analytics
        logger.debug("No analytics results: %s", error)
        return None


# --- everything at once: the dashboard and /api/stats/summary/ ---------------------------------


def console_summary() -> dict[str, Any]:
    # The outbox's counts read every event the relay has still to send and every held event
    # (200 ms for 20,000 of each): cached like the other slow reads. The oldest pending age
    # is computed from the cached oldest creation time, so it keeps growing between reads.
    outbox_counts = cached("outbox-counts", lambda: status_counts(OutboxEvent))
    inbox_counts = status_counts(InboxMessage)
    oldest = outbox_oldest_pending_age_seconds(outbox_counts.backlog)
    now = timezone.now()
    return {
        "outbox": {
            "counts": outbox_counts.counts,
            "done_estimated": outbox_counts.done_estimated,
            "oldest_pending_age_seconds": oldest,
        },
        "inbox": {
            "counts": inbox_counts.counts,
            "done_estimated": inbox_counts.done_estimated,
            "duplicates_last_hour": duplicates_since(now - timedelta(hours=1)),
        },
        "failures_by_error_class": cached("failures", failures_by_error_class),
    }
