"""Reads of the outbox for the console, the API and the metrics."""

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    Count,
    Exists,
    Max,
    OuterRef,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Greatest, NullIf
from django.utils import timezone

from outbox.ids import DRAWN_TIME_MARGIN, drawn_time_range
from outbox.models import OutboxDelivery, OutboxEvent, OutboxGivenEventId, OutboxHeldEvent
from outbox.services.event_log.deliveries import RECORD_CLOCK_MARGIN, RECORD_CLOCK_MARGIN_SQL
from outbox.services.event_log.held import HELD_EVENT_ROW_JOIN
from outbox.services.event_log.shards import ALL_SHARDS

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


@dataclass(frozen=True)
class QuarantinedKey:
    topic: str
    key: str
    blocking_event_id: str
    blocking_status: str
    blocking_attempts: int
    blocking_error: str
    blocking_next_attempt_at: datetime | None
    waiting_events: int


def outbox_quarantined_keys(*, limit: int = 100) -> list[QuarantinedKey]:
    """The keys the relay holds back, each with its head (the first of its held events in
    commit order): FAILED once its attempts are spent, else PENDING (backing off, or due), and
    how many held events wait behind it. Heads waiting for an operator come first, then by
    their next try. The held set is small (rows exist only for keys with a failure, a replay
    or a discard), so it is read whole."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT topic, key, event_id,
                   CASE WHEN next_attempt_at IS NULL AND attempts > 0 THEN 'FAILED'
                        ELSE 'PENDING' END,
                   attempts, last_error, next_attempt_at, waiting
            FROM (
                SELECT topic, key, event_id, attempts, next_attempt_at, last_error, position,
                       row_number() OVER per_key AS rank,
                       count(*) OVER (PARTITION BY topic, key) - 1 AS waiting
                FROM outbox_held_event
                WINDOW per_key AS (PARTITION BY topic, key ORDER BY position)
            ) AS held
            WHERE rank = 1
            ORDER BY next_attempt_at NULLS FIRST, attempts DESC, position
            LIMIT %s
            """,
            [limit],
        )
        rows = cursor.fetchall()
    return [_quarantined_key(row) for row in rows]


def _quarantined_key(row: Sequence[Any]) -> QuarantinedKey:
    return QuarantinedKey(
        topic=row[0],
        key=row[1],
        blocking_event_id=str(row[2]),
        blocking_status=row[3],
        blocking_attempts=row[4],
        blocking_error=row[5],
        blocking_next_attempt_at=row[6],
        waiting_events=row[7],
    )


def outbox_oldest_pending_age_seconds(backlog: "LogBacklog | None" = None) -> float | None:
    """Seconds since the oldest event still to be sent was created, or None when there is
    none: the oldest of the unsent and the held, not spent, events (of `backlog`, else of
    outbox_log_backlog() read now)."""
    oldest = (backlog or outbox_log_backlog()).oldest_pending_created_at
    return None if oldest is None else (timezone.now() - oldest).total_seconds()


# The windows outbox_last_published_at looks back through, shortest first.
LAST_PUBLISHED_WINDOWS = (timedelta(minutes=1), timedelta(hours=1), timedelta(days=1), None)


def outbox_last_published_at() -> datetime | None:
    """When the broker last confirmed an event: the time of the latest PUBLISHED delivery
    record. The records have no B-tree index to walk from the newest (migration 0014), so the
    last minute is read first through the BRIN index on published_at, then the last hour,
    day, and all of them, until one has a record."""
    published = OutboxDelivery.objects.filter(outcome=OutboxDelivery.Outcome.PUBLISHED)
    now = timezone.now()
    for window in LAST_PUBLISHED_WINDOWS:
        records = published if window is None else published.filter(published_at__gte=now - window)
        latest = records.aggregate(latest=Max("published_at"))["latest"]
        if latest is not None:
            return latest
    return None


# --- the relay's backlog ---------------------------------------------------------------------
# The relay never updates an event row, so no index on the rows says what is left to send.
# Its cursors do: every event visible in the snapshot of the oldest current cursor's tick is
# delivered, held or discarded, so what is left is found on the (txid, position) index from
# that snapshot's xmax and among the transactions it saw running (the events after the
# cursors, few while the relay keeps up), less those with an outcome, plus the held set
# (small). The backlog scans neither the event nor the delivery table.

# A snapshot in which no transaction is visible: with no cursor recorded, every event is left.
NOTHING_VISIBLE_SNAPSHOT = "1:1:"


@dataclass(frozen=True)
class LogBacklog:
    # Events after the cursors with no PUBLISHED or DISCARDED record, not held.
    unsent: int
    # Held events still to be sent: a head backing off or due, or one queued behind a head.
    held_waiting: int
    # Held heads whose attempts are spent: FAILED, waiting for an operator.
    held_spent: int
    # The oldest created_at of the unsent and the held-waiting events.
    oldest_pending_created_at: datetime | None


def outbox_log_cursor_snapshot() -> str:
    """The snapshot of the tick of the oldest current cursor (the latest cursor row of each
    shard, as outbox.services.event_log.cursors.cursors_read reads them), read in one statement: a
    purge of ticks between two reads could not take it away."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT tick.snapshot::text FROM outbox_tick AS tick
            WHERE tick.id = (
                SELECT min(latest.tick_id)
                FROM unnest(%s::smallint[]) AS shard
                CROSS JOIN LATERAL (
                    SELECT tick_id FROM outbox_relay_cursor
                    WHERE shard = ANY(shards) ORDER BY id DESC LIMIT 1
                ) AS latest
            )
            """,
            [list(ALL_SHARDS)],
        )
        row = cursor.fetchone()
    return row[0] if row else NOTHING_VISIBLE_SNAPSHOT


# The events after the cursors with no outcome yet, not held: those of the transactions the
# oldest cursor's snapshot did not see, as the relay reads a span (event_log.spans): a range of
# the (txid, position) index from the snapshot's xmax, and the transactions of its xip list.
# Never a range from its xmin: a writer idle in its transaction would make every count walk all
# that committed since it began. Each is checked for an outcome through the event_id indexes of
# the day partitions from its creation on (RECORD_CLOCK_MARGIN). The snapshot and its xip list
# go in as constants (_unsent_parameters), so that the planner reads the size of that range
# from the statistics (and the end of the index), and sees how few transactions the list
# holds: an xip list it could not count (a subquery's array) was planned as a read of every
# event, and the delivery table hashed whole to check them.
_UNSENT_EVENTS_SQL = f"""
FROM (
    SELECT id, created_at, txid, position FROM outbox_event
    WHERE txid >= pg_snapshot_xmax(%(since)s::pg_snapshot)
    UNION ALL
    SELECT id, created_at, txid, position FROM outbox_event
    WHERE txid = ANY(%(running)s::xid8[])
) AS event
WHERE NOT EXISTS (
      SELECT 1 FROM outbox_delivery AS delivery
      WHERE delivery.event_id = event.id AND delivery.outcome IN ('PUBLISHED', 'DISCARDED')
        AND delivery.published_at >= event.created_at - {RECORD_CLOCK_MARGIN_SQL}
  )
  AND NOT EXISTS (SELECT 1 FROM outbox_held_event AS held WHERE held.event_id = event.id)
"""  # noqa: S608 (constants only)


def _unsent_parameters(snapshot: str) -> dict[str, str]:
    """The parameters of _UNSENT_EVENTS_SQL for a snapshot in PostgreSQL's text form
    (xmin:xmax:xip,...): the snapshot, and its xip list as an array literal."""
    return {"since": snapshot, "running": "{" + snapshot.split(":")[2] + "}"}


_UNSENT_SQL = f"SELECT count(*) AS events, min(event.created_at) AS oldest {_UNSENT_EVENTS_SQL}"


def outbox_log_backlog() -> LogBacklog:
    """What the event-log relay has still to send (PENDING) or has given up on until an
    operator acts (FAILED), and the creation time of the oldest event still to be sent. Held
    events whose row is gone (the relay lets them go) are not counted."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH unsent AS ({_UNSENT_SQL}),
            held AS (
                SELECT count(*) FILTER (WHERE held.spent) AS spent,
                       count(*) FILTER (WHERE NOT held.spent) AS waiting,
                       min(event.created_at) FILTER (WHERE NOT held.spent) AS oldest
                FROM (
                    SELECT event_transaction_id, event_position, event_created_at,
                           next_attempt_at IS NULL AND attempts > 0 AS spent
                    FROM outbox_held_event
                ) AS held
                -- Each held row's event in the partition of its day: a join would read the
                -- whole event table into a hash instead.
                CROSS JOIN LATERAL (
                    SELECT event.created_at FROM outbox_event AS event
                    WHERE {HELD_EVENT_ROW_JOIN} LIMIT 1
                ) AS event
            )
            SELECT unsent.events, held.waiting, held.spent, least(unsent.oldest, held.oldest)
            FROM unsent, held
            """,  # noqa: S608 (composed of constants; values are parameters)
            _unsent_parameters(outbox_log_cursor_snapshot()),
        )
        unsent, waiting, spent, oldest = cursor.fetchone()
    return LogBacklog(
        unsent=unsent, held_waiting=waiting, held_spent=spent, oldest_pending_created_at=oldest
    )


def outbox_log_done_count() -> int:
    """The events delivered, counted exactly: every event less those left to send (unsent or
    held) and those given up on (the latest of their PUBLISHED and DISCARDED records is a
    DISCARDED one). One statement, so the parts are counted at the same instant.

    This is outbox_events_with_delivery's DONE as long as every event the cursors have passed
    was delivered, held or discarded, which the relay keeps true (and migration 0012, for what
    the claim relay of earlier versions left). Counting that DONE event by event would join
    the two tables whole: six times the cost of this on 200,000 events. This still counts
    every event row and reads the delivery table for its DISCARDED records: for small tables
    only (the console estimates DONE on big ones)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH unsent AS ({_UNSENT_SQL}),
            discarded AS (
                SELECT final.event_id FROM (
                    SELECT DISTINCT ON (event_id) event_id, outcome FROM outbox_delivery
                    WHERE outcome IN ('PUBLISHED', 'DISCARDED')
                      AND event_id IN (
                          SELECT event_id FROM outbox_delivery WHERE outcome = 'DISCARDED'
                      )
                    ORDER BY event_id, id DESC
                ) AS final
                WHERE final.outcome = 'DISCARDED'
            )
            SELECT (SELECT count(*) FROM outbox_event)
                   - (SELECT events FROM unsent)
                   - (SELECT count(*) FROM outbox_held_event AS held
                      WHERE EXISTS (SELECT 1 FROM outbox_event AS event
                                    WHERE {HELD_EVENT_ROW_JOIN}))
                   - (SELECT count(*) FROM discarded
                      WHERE EXISTS (SELECT 1 FROM outbox_event AS event
                                    WHERE event.id = discarded.event_id)
                        AND NOT EXISTS (SELECT 1 FROM outbox_held_event AS held
                                        WHERE held.event_id = discarded.event_id))
            """,  # noqa: S608 (composed of constants; values are parameters)
            _unsent_parameters(outbox_log_cursor_snapshot()),
        )
        return int(cursor.fetchone()[0])


class DeliveryAnnotations(TypedDict):
    delivery_status: str
    delivery_discarded_at: datetime | None
    delivery_attempts: int
    delivery_error: str
    delivery_next_attempt_at: datetime | None
    delivered_at: datetime | None
    delivered_partition: int | None
    delivered_offset: int | None


if TYPE_CHECKING:
    DeliveredEvent = WithAnnotations[OutboxEvent, DeliveryAnnotations]


class ProbedExists(Exists):
    """EXISTS that PostgreSQL evaluates by probing an index for each row it is asked about.

    A plain EXISTS may be planned as a hash of the whole subquery, built once per partition
    the outer query scans: the planner counts a call for every row of the table, not for the
    page's rows a LIMIT leaves. For the held events (20,000 rows when many keys are held)
    that is a sequential read of the held table per day partition, for a page of 25. OFFSET
    0 keeps the subquery from being turned into the hashable form."""

    template = "EXISTS(%(subquery)s OFFSET 0)"


def _records_of_outer_event() -> QuerySet[OutboxDelivery]:
    """The delivery records of the outer query's event. Each read of them probes the delivery
    table's day partitions from the event's creation on only (RECORD_CLOCK_MARGIN), not all."""
    return OutboxDelivery.objects.filter(
        event_id=OuterRef("pk"), published_at__gte=OuterRef("created_at") - RECORD_CLOCK_MARGIN
    )


def outbox_events_with_delivery(
    queryset: QuerySet[OutboxEvent],
) -> "QuerySet[DeliveredEvent]":
    """The events of `queryset` with their delivery as users see it: `delivery_status`
    (PENDING, DONE or FAILED), `delivery_discarded_at`, `delivery_attempts` (tries that ended
    in a delivery report), `delivery_error` (the last one's), `delivery_next_attempt_at` (when
    a held event is tried next; none once its attempts are spent, or for an event not held),
    and where the latest publication went: `delivered_at`, `delivered_partition`,
    `delivered_offset`.

    A held event is PENDING, or FAILED once its attempts are spent; otherwise the latest
    PUBLISHED or DISCARDED delivery record decides (a replay holds the event again, and its
    new record supersedes the earlier one); an event with neither waits for the relay."""
    outcome = OutboxDelivery.Outcome
    status = OutboxEvent.Status
    records = _records_of_outer_event()
    published = records.filter(outcome=outcome.PUBLISHED).order_by("-id")
    final = records.filter(outcome__in=(outcome.PUBLISHED, outcome.DISCARDED)).order_by("-id")
    held = OutboxHeldEvent.objects.filter(event_id=OuterRef("pk"))
    tries = (
        records.filter(outcome__in=(outcome.PUBLISHED, outcome.FAILED))
        .order_by()
        .values("event_id")
        .annotate(count=Count("id"))
        .values("count")
    )
    return queryset.alias(
        held=ProbedExists(held),
        held_spent=ProbedExists(held.filter(next_attempt_at__isnull=True, attempts__gt=0)),
        final_outcome=Subquery(final.values("outcome")[:1]),
    ).annotate(
        delivery_status=Case(
            When(held_spent=True, then=Value(status.FAILED)),
            When(held=True, then=Value(status.PENDING)),
            When(final_outcome=outcome.PUBLISHED, then=Value(status.DONE)),
            When(final_outcome=outcome.DISCARDED, then=Value(status.FAILED)),
            default=Value(status.PENDING),
            output_field=CharField(),
        ),
        delivery_discarded_at=Case(
            When(held=True, then=None),
            When(final_outcome=outcome.DISCARDED, then=Subquery(final.values("published_at")[:1])),
            default=None,
        ),
        # A held head's attempts count the tries since its last retry by an operator, and
        # those an earlier version recorded only as a number (migration 0012).
        delivery_attempts=Greatest(
            Coalesce(Subquery(held.values("attempts")[:1]), 0), Coalesce(Subquery(tries), 0)
        ),
        delivery_error=Coalesce(
            NullIf(Subquery(held.values("last_error")[:1]), Value("")),
            Subquery(records.filter(outcome=outcome.FAILED).order_by("-id").values("error")[:1]),
            Value(""),
            output_field=TextField(),
        ),
        delivery_next_attempt_at=Subquery(held.values("next_attempt_at")[:1]),
        delivered_at=Subquery(published.values("published_at")[:1]),
        delivered_partition=Subquery(published.values("kafka_partition")[:1]),
        delivered_offset=Subquery(published.values("kafka_offset")[:1]),
    )


def outbox_event_records(event: OutboxEvent) -> QuerySet[OutboxDelivery]:
    """The delivery records of `event`, oldest first: its attempts."""
    return OutboxDelivery.objects.filter(
        event_id=event.pk, published_at__gte=event.created_at - RECORD_CLOCK_MARGIN
    ).order_by("id")


def outbox_event_delivered(*, event_id: uuid.UUID | str) -> "DeliveredEvent":
    """One event with its delivery as users see it (outbox_events_with_delivery)."""
    return outbox_events_with_delivery(OutboxEvent.objects.filter(pk=event_id)).get()


# The admin's status filter offers these besides the statuses: events an operator discarded,
# and the FAILED events none has: the held heads whose attempts are spent, which wait for an
# operator (what the outbox's failure groups hold, and their retry and discard act on).
DISCARDED = "discarded"
WAITING_FOR_OPERATOR = "waiting"


# A filter that finds its events through another table (the held set, the delivery records of a
# publish window, the failed tries of an error class) reads up to this many of them. Fewer:
# the events are read by their places or ids (outbox_events_among). As many: the filter matches
# many events, and the list reads the newest first, checking each, which fills a page soon.
FEW_EVENTS = 1000


def outbox_events_in_state(events: QuerySet, *, state: str) -> QuerySet:
    """The events of `events` (annotated by outbox_events_with_delivery) whose delivery_status
    is `state` (PENDING, DONE or FAILED; FAILED includes the discarded ones), or with state
    "discarded", the ones an operator discarded.

    The annotations are computed per row: filtered on them alone, a rare state would have
    PostgreSQL compute them for every row of the table. So each state is narrowed first by a
    condition it implies (the annotations decide among what is left):
    - FAILED, rare and what operators look for, exactly by the places of the spent held heads
      and of the events discarded last (FAILED_PLACE_SQL), no annotation computed to filter;
    - discarded, exactly, by the places of the events discarded last (DISCARDED_PLACE_SQL);
    - PENDING, exactly, by the places of the held events not spent and of the unsent events
      (after the relay's cursors, a range of the (txid, position) index, with no outcome),
      no annotation computed to filter;
    - DONE by having a PUBLISHED record, one look-up that PostgreSQL makes before computing
      the status (a cheaper condition first): a relay far behind leaves thousands of unsent
      events at the head of the newest-first order, each passed over by that look-up alone."""
    if state == DISCARDED:
        places = RawSQL(DISCARDED_PLACE_SQL, (), output_field=BooleanField())  # noqa: S611
        return events.filter(places, delivery_discarded_at__isnull=False)
    if state == OutboxEvent.Status.FAILED:
        # Exactly the FAILED events, without computing delivery_status per row.
        return events.filter(RawSQL(FAILED_PLACE_SQL, (), output_field=BooleanField()))  # noqa: S611
    if state == WAITING_FOR_OPERATOR:
        return events.filter(RawSQL(WAITING_PLACE_SQL, (), output_field=BooleanField()))  # noqa: S611
    if state == OutboxEvent.Status.PENDING:
        # Django's expressions take positional parameters: each named one, at each place.
        parameters = _unsent_parameters(outbox_log_cursor_snapshot())
        names = re.findall(r"%\((\w+)\)s", PENDING_PLACE_SQL)
        pending = re.sub(r"%\(\w+\)s", "%s", PENDING_PLACE_SQL)
        return events.filter(
            RawSQL(pending, [parameters[name] for name in names], output_field=BooleanField())  # noqa: S611
        )
    if state == OutboxEvent.Status.DONE:
        published = _records_of_outer_event().filter(outcome=OutboxDelivery.Outcome.PUBLISHED)
        # In one CASE, so that the look-up comes first for each row: as a condition of its own
        # PostgreSQL would join it after computing the status.
        done = Case(
            When(~Exists(published), then=Value(False)),
            When(delivery_status=state, then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
        return events.filter(done)
    return events.filter(delivery_status=state)


# An event row's place: the relay's index of commit order, behind the partition key.
_EVENT_PLACE_IN = (
    '("outbox_event"."created_at", "outbox_event"."txid", "outbox_event"."position") IN'
)
# The places of the held events' rows, and which held events are heads whose attempts are spent.
_HELD_PLACES_SQL = """
    SELECT held.event_created_at, held.event_transaction_id::text::xid8, held.event_position
    FROM outbox_held_event AS held"""
_HELD_SPENT = "held.next_attempt_at IS NULL AND held.attempts > 0"
_DRAWN_TIME_MARGIN_SQL = f"interval '{int(DRAWN_TIME_MARGIN.total_seconds())} seconds'"
# The creation time an id drawn from the clock carries (outbox.ids.time_ordered_event_id: the
# first 48 bits, in milliseconds, of a version 7 UUID), NULL for any other id.
_DRAWN_TIME_SQL = """
    CASE WHEN substr(wanted.id::text, 15, 1) = '7' THEN to_timestamp(
        ('x' || substr(replace(wanted.id::text, '-', ''), 1, 12))::bit(48)::bigint / 1000.0
    ) END"""
# The places of the event rows whose ids {ids} (a subquery) selects, each found in the
# partition and the BRIN ranges of its own creation time: the time its given-id row keeps
# (a caller's own id), else around the time a drawn id carries (outbox.ids.drawn_time_range).
# The table has no B-tree on the id (each would cost every publish a WAL record); an id lookup
# without its time would read the BRIN index of every partition, or the table.
_EVENT_PLACES_OF_IDS_SQL = f"""
    SELECT event.created_at, event.txid, event.position
    FROM ({{ids}}) AS wanted(id)
    LEFT JOIN outbox_event_given_id AS given ON given.id = wanted.id
    CROSS JOIN LATERAL (
        SELECT created_at, txid, position FROM outbox_event AS event
        -- Compared as text: by the id's BRIN index, the look-up reads every summary of the
        -- partition, where the time's reads a few (measured: 1.1 against 0.03 ms).
        WHERE event.id::text = wanted.id::text
          AND event.created_at >= coalesce(
                  given.created_at, {_DRAWN_TIME_SQL} - {_DRAWN_TIME_MARGIN_SQL})
          AND event.created_at <= coalesce(
                  given.created_at, {_DRAWN_TIME_SQL} + {_DRAWN_TIME_MARGIN_SQL})
        OFFSET 0
    ) AS event"""  # noqa: S608 (constants only)
# The events an operator discarded: not held, and whose latest PUBLISHED or DISCARDED record is
# DISCARDED (not published again by a replay since), found by the partial index of DISCARDED
# records. A discard's record carries its event row's place (migration 0019); one without (a
# discard recorded before) has its event looked up by id.
_LAST_DISCARDS_SQL = """
    SELECT record.event_id, record.event_created_at,
           record.event_transaction_id::text::xid8 AS event_transaction_id,
           record.event_position
    FROM outbox_delivery AS record
    WHERE record.outcome = 'DISCARDED'
      AND NOT EXISTS (
          SELECT 1 FROM outbox_delivery AS later
          WHERE later.event_id = record.event_id AND later.id > record.id
            AND later.outcome = 'PUBLISHED'
      )
      AND NOT EXISTS (
          SELECT 1 FROM outbox_held_event AS held_again
          WHERE held_again.event_id = record.event_id
      )"""
_UNPLACED_DISCARDS_SQL = f"""
    SELECT event_id FROM ({_LAST_DISCARDS_SQL}) AS discard WHERE event_position IS NULL"""  # noqa: S608 (constants only)
_UNPLACED_DISCARD_PLACES_SQL = _EVENT_PLACES_OF_IDS_SQL.format(ids=_UNPLACED_DISCARDS_SQL)
_DISCARDED_PLACES_SQL = f"""
    SELECT discard.event_created_at, discard.event_transaction_id, discard.event_position
    FROM ({_LAST_DISCARDS_SQL}) AS discard
    WHERE discard.event_position IS NOT NULL
    UNION ALL
{_UNPLACED_DISCARD_PLACES_SQL}"""  # noqa: S608 (constants only)
DISCARDED_PLACE_SQL = f"{_EVENT_PLACE_IN} ({_DISCARDED_PLACES_SQL})"


# The places of the FAILED events, matched through the event table's (txid, position) index as
# the relay finds a held event (the id has only a BRIN index): the held heads whose attempts
# are spent, and the events an operator discarded. The first alone are the events waiting for
# an operator (WAITING_FOR_OPERATOR).
WAITING_PLACE_SQL = f"{_EVENT_PLACE_IN} ({_HELD_PLACES_SQL} WHERE {_HELD_SPENT})"
FAILED_PLACE_SQL = f"""
{_EVENT_PLACE_IN} (
{_HELD_PLACES_SQL} WHERE {_HELD_SPENT}
    UNION ALL
{_DISCARDED_PLACES_SQL}
)
"""


# The places of the PENDING events: the held events whose attempts are not spent (a head
# backing off or due, or one queued behind a head) and the unsent events.
PENDING_PLACE_SQL = f"""
{_EVENT_PLACE_IN} (
{_HELD_PLACES_SQL} WHERE NOT ({_HELD_SPENT})
    UNION ALL
    SELECT event.created_at, event.txid, event.position {_UNSENT_EVENTS_SQL}
)
"""


def outbox_events_discarded(events: QuerySet, *, discarded: bool) -> QuerySet:
    """The events of `events` (annotated) an operator discarded, or the others."""
    if discarded:
        return outbox_events_in_state(events, state=DISCARDED)
    return events.filter(delivery_discarded_at__isnull=True)


# The places of the events whose id is one of the texts %s, created at the times {within}.
_PLACES_OF_IDS_AT_TIMES_SQL = """
    SELECT created_at, txid, position FROM outbox_event
    WHERE id::text = ANY(%s) AND ({within})"""


def outbox_events_among(events: QuerySet, event_ids: Sequence[uuid.UUID]) -> QuerySet:
    """The events of `events` whose id is one of `event_ids` (a few: FEW_EVENTS at most), read
    in the creation times those ids allow: a caller's own id at the time its given-id row
    keeps, an id publish() drew around the time it carries (outbox.ids.drawn_time_range).
    One statement: PostgreSQL reads the creation time's BRIN index once per time (a bitmap of
    a few 8-page ranges each) in the partition of that time only, compares the ids as text
    there (by the id's BRIN index, each id would read every summary of a partition), and
    finds the list's rows by their places."""
    ids = set(event_ids)
    given = dict(OutboxGivenEventId.objects.filter(id__in=ids).values_list("id", "created_at"))
    # Per day, the times the ids allow and those ids: a SELECT of the matching places per day
    # (PostgreSQL evaluates every time of a statement in each partition it reads, and each of
    # these reads only the partition of its day), each comparing only its own ids.
    by_day: dict[date, tuple[list[tuple[datetime, datetime]], list[str]]] = {}
    for event_id in ids:
        if event_id in given:
            start = end = given[event_id]
        else:
            start, end = drawn_time_range(event_id)
            if start == end:  # neither drawn nor given: no event has it
                continue
        spans, day_ids = by_day.setdefault(start.astimezone(UTC).date(), ([], []))
        spans.append((start, end))
        day_ids.append(str(event_id))
    if not by_day:
        return events.none()
    selects = []
    parameters: list[Any] = []
    for spans, day_ids in by_day.values():
        merged = _merged(sorted(spans))
        within = " OR ".join(["created_at BETWEEN %s AND %s"] * len(merged))
        selects.append(_PLACES_OF_IDS_AT_TIMES_SQL.format(within=within))
        parameters.append(day_ids)
        parameters.extend(moment for span in merged for moment in span)
    among = RawSQL(  # noqa: S611 (constants; the ids and times are parameters)
        f"{_EVENT_PLACE_IN} ({' UNION ALL '.join(selects)})",
        parameters,
        output_field=BooleanField(),
    )
    return events.filter(among)


def _merged(spans: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """`spans` (sorted by start) with the overlapping ones made one."""
    merged: list[tuple[datetime, datetime]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def outbox_events_published(events: QuerySet, **bounds: datetime) -> QuerySet:
    """The events of `events` (annotated by outbox_events_with_delivery) whose latest
    publication (delivered_at) is within `bounds`: Django lookups of a time (gte=..., lt=...,
    lte=...). The delivery records of that window are read first (their day partitions and
    BRIN index): none, and no event is; a few, and those events are read by id
    (outbox_events_among); many, and the list is read newest first from the window's end on
    (an event is published after its creation), each event checked."""
    published = OutboxDelivery.objects.filter(
        outcome=OutboxDelivery.Outcome.PUBLISHED,
        **{f"published_at__{lookup}": moment for lookup, moment in bounds.items()},
    )
    event_ids = list(published.values_list("event_id", flat=True)[:FEW_EVENTS])
    in_window = events.filter(
        **{f"delivered_at__{lookup}": moment for lookup, moment in bounds.items()}
    )
    if len(event_ids) < FEW_EVENTS:
        return outbox_events_among(in_window, event_ids)
    window_end = bounds.get("lt", bounds.get("lte"))
    if window_end is not None:
        in_window = in_window.filter(created_at__lte=window_end + RECORD_CLOCK_MARGIN)
    return in_window
