"""Recording a batch of records: one row per event id, deduplicated, each new one run by
its handler; the statuses of a row and the state a failure leaves it in."""

import datetime as dt
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import connection
from django.utils import timezone

from inbox import metrics
from inbox.conf import inbox_settings
from inbox.errors import (
    ConcurrentDelivery,
    ImproperlyConfiguredInbox,
    PositionGap,
    UnknownEventType,
)
from inbox.models import InboxMessage
from inbox.records import InboxRecord, poison_description
from inbox.registry import Handler, HandlerRegistry, get_registry
from inbox.services.attempts import Attempt, attempt_member, attempt_of, inbox_attempts_insert
from inbox.services.handler_runs import _run_handler, format_error
from inbox.services.offsets import (
    _require_atomic,
    consumer_offsets_advance,
    consumer_offsets_lock,
)
from inbox.services.sequences import group_ordering, held_sequences
from inbox.tracing import Outcome, process_span, running_in
from kafka_events.tracing import active_tracer

UNKNOWN_EVENT_TYPE_CHOICES = ("ignore", "fail")

PENDING = InboxMessage.Status.PENDING.value
DONE = InboxMessage.Status.DONE.value
FAILED = InboxMessage.Status.FAILED.value
PARKED = InboxMessage.Status.PARKED.value


@dataclass
class BatchResult:
    consumed: int = 0
    inserted: int = 0
    duplicates: int = 0
    processed: int = 0
    failed: int = 0
    poison: int = 0
    ignored: int = 0
    deferred: int = 0
    # Recorded behind an earlier row of their key that is not done (ordering "key").
    parked: int = 0
    # Records below the stored offset of an exactly-once group: already applied.
    skipped: int = 0
    handler_seconds: list[float] = field(default_factory=list)
    consume_lag_seconds: list[float] = field(default_factory=list)

    def record_metrics(self, group: str) -> None:
        """Call after the batch's transaction committed: metrics count what is durable."""
        metrics.CONSUMED.labels(group).inc(self.consumed)
        metrics.PROCESSED.labels(group).inc(self.processed)
        metrics.DUPLICATES.labels(group).inc(self.duplicates + self.skipped)
        metrics.FAILED.labels(group, "handler").inc(self.failed)
        metrics.FAILED.labels(group, "poison").inc(self.poison)
        metrics.IGNORED.labels(group).inc(self.ignored)
        metrics.DEFERRED.labels(group).inc(self.deferred)
        metrics.PARKED.labels(group).inc(self.parked)
        metrics.observe_all(metrics.HANDLER_SECONDS, group, self.handler_seconds)
        metrics.observe_all(metrics.CONSUME_LAG_SECONDS, group, self.consume_lag_seconds)


def retry_delay_seconds(*, attempts: int) -> float:
    """Exponential backoff with jitter: a random delay in [d/2, d], d = base * 2**(attempts-1)."""
    base = inbox_settings.RETRY_BASE_SECONDS
    delay = min(inbox_settings.RETRY_MAX_SECONDS, base * 2 ** max(0, attempts - 1))
    return delay / 2 + random.uniform(0, delay / 2)


def _binary_cursor() -> psycopg.Cursor[Any]:
    """A psycopg cursor with server-side binding, for the batch statements: their arrays go
    over the wire in binary (%b), with no quoting of a batch's payloads in Python."""
    connection.ensure_connection()
    return psycopg.Cursor(connection.connection)


def _failure_state(*, attempts: int, now: dt.datetime) -> tuple[str, dt.datetime | None]:
    if attempts >= inbox_settings.MAX_ATTEMPTS:
        return FAILED, None
    return PENDING, now + dt.timedelta(seconds=retry_delay_seconds(attempts=attempts))


# The batch's rows that exist already, and an id for each new one: handlers run before the
# INSERT (so that it can write when each finished), and a handler's message carries its id.
# A redelivery is counted here at once, in the same statement (no second one, and no payload
# shipped again: a replay of duplicates is no slower than new events); its row then stays
# locked until the batch commits, so no other transaction deletes it meanwhile.
_LOOKUP_SQL = """
WITH batch AS (
    SELECT * FROM unnest(%(event_id)s::text[], %(extra)s::integer[]) AS b(event_id, extra)
), found AS (
    SELECT b.event_id, m.id, m.status, m.attempts, m.duplicate_count, b.extra
    FROM batch AS b
    JOIN LATERAL (
        -- LIMIT keeps this a probe of the unique index per event id, whatever the statistics.
        SELECT id, status, attempts, duplicate_count FROM inbox_message
        WHERE consumer_group = %(group)s AND event_id = b.event_id
        LIMIT 1
    ) AS m ON true
), counted AS (
    UPDATE inbox_message AS m SET
        duplicate_count = m.duplicate_count + 1 + f.extra, last_duplicate_at = %(now)s
    FROM found AS f
    WHERE m.id = f.id
    RETURNING m.id
)
SELECT b.event_id, f.id, f.status, f.attempts, f.duplicate_count,
    CASE WHEN f.id IS NULL THEN nextval(pg_get_serial_sequence('inbox_message', 'id')) END,
    (SELECT count(*) FROM counted)
FROM batch AS b
LEFT JOIN found AS f USING (event_id)
"""

_INSERT_SQL = """
INSERT INTO inbox_message (
    id, event_id, consumer_group, topic, "partition", "offset", key, event_type,
    aggregate_type, aggregate_id, payload, headers, raw_value, raw_value_encoding, status,
    attempts, next_attempt_at, last_error, published_at, received_at, processed_at,
    duplicate_count, last_duplicate_at, released_at
)
SELECT r.id, r.event_id, %(group)s, r.topic, r.partition, r.offset, r.key, r.event_type,
    r.aggregate_type, r.aggregate_id, r.payload::jsonb, r.headers::jsonb, r.raw_value,
    r.raw_value_encoding, r.status, r.attempts, r.next_attempt_at, r.last_error,
    r.published_at, %(now)s, r.processed_at, r.duplicate_count,
    CASE WHEN r.duplicate_count > 0 THEN %(now)s::timestamptz END,
    CASE WHEN r.released THEN %(now)s::timestamptz END
FROM unnest(
    %(id)b::bigint[], %(event_id)b::text[], %(topic)b::text[], %(partition)b::integer[],
    %(offset)b::bigint[], %(key)b::text[], %(event_type)b::text[], %(aggregate_type)b::text[],
    %(aggregate_id)b::text[], %(payload)b::text[], %(headers)b::text[], %(raw_value)b::text[],
    %(raw_value_encoding)b::text[], %(status)b::text[], %(attempts)b::integer[],
    %(next_attempt_at)b::timestamptz[], %(last_error)b::text[],
    %(published_at)b::timestamptz[], %(processed_at)b::timestamptz[],
    %(duplicate_count)b::integer[], %(released)b::boolean[]
) AS r(
    id, event_id, topic, partition, "offset", key, event_type, aggregate_type, aggregate_id,
    payload, headers, raw_value, raw_value_encoding, status, attempts, next_attempt_at,
    last_error, published_at, processed_at, duplicate_count, released
)
ON CONFLICT (consumer_group, event_id) DO UPDATE SET
    duplicate_count = inbox_message.duplicate_count + 1 + EXCLUDED.duplicate_count,
    last_duplicate_at = EXCLUDED.received_at
RETURNING event_id, (xmax = 0) AS inserted
"""

_UPDATE_SQL = """
UPDATE inbox_message AS m SET
    status = u.status, attempts = u.attempts, next_attempt_at = u.next_attempt_at,
    last_error = u.last_error, processed_at = u.processed_at
FROM unnest(
    %b::bigint[], %b::text[], %b::integer[], %b::timestamptz[], %b::text[], %b::timestamptz[]
) AS u(id, status, attempts, next_attempt_at, last_error, processed_at)
WHERE m.id = u.id
"""


@dataclass(slots=True)
class _Row:
    record: InboxRecord
    entry: Handler | None
    # The state the row is inserted in, when it is new.
    status: str
    last_error: str = ""
    extra_deliveries: int = 0
    attempts: int = 0
    next_attempt_at: dt.datetime | None = None
    processed_at: dt.datetime | None = None
    # From the lookup: the row's id, and whether it existed before this batch.
    pk: int = 0
    existed: bool = False
    # A poison row: no handler can ever run it, so it never holds its key.
    released: bool = False


# A row's status, attempts, next_attempt_at, last_error and processed_at after its handler.
_State = tuple[str, int, dt.datetime | None, str, dt.datetime | None]


def states_update(states: Sequence[tuple[int, *_State]]) -> None:
    """Writes the state of many rows, (id, status, attempts, next_attempt_at, last_error,
    processed_at) each, in one statement."""
    with _binary_cursor() as cursor:
        cursor.execute(_UPDATE_SQL, [list(column) for column in zip(*states, strict=True)])


@dataclass(frozen=True, slots=True)
class _Existing:
    status: str
    attempts: int
    duplicate_count: int


def _classify(
    *,
    group: str,
    records: Sequence[InboxRecord],
    registry: HandlerRegistry,
    unknown_event_type: str,
    result: BatchResult,
) -> list[_Row]:
    """One row per event id (the first delivery in the batch); later ones count as duplicates."""
    handlers = registry.for_group(group)
    rows: dict[str, _Row] = {}
    for record in records:
        row = rows.get(record.event_id)
        if row is not None:
            row.extra_deliveries += 1
            continue
        if record.poison is not None:
            rows[record.event_id] = _Row(
                record, None, FAILED, last_error=poison_description(record.poison), released=True
            )
            continue
        entry = handlers.get(record.event_type)
        if entry is None:
            if unknown_event_type == "ignore":
                result.ignored += 1
                continue
            poison = UnknownEventType(
                f"Group {group!r} has no handler for event type {record.event_type!r}. Add one "
                'and replay the row, or set INBOX["UNKNOWN_EVENT_TYPE"] to "ignore".'
            )
            rows[record.event_id] = _Row(
                record, None, FAILED, last_error=poison_description(poison), released=True
            )
            continue
        # Set by its handler's outcome before the INSERT.
        rows[record.event_id] = _Row(record, entry, PENDING)
    return list(rows.values())


def _lookup(*, group: str, rows: Sequence[_Row], now: dt.datetime) -> dict[str, _Existing]:
    """Sets each row's id and `existed`, and counts the redelivery of the rows that existed;
    returns their state as it was before this batch."""
    by_event_id = {row.record.event_id: row for row in rows}
    existing: dict[str, _Existing] = {}
    params = {
        "event_id": list(by_event_id),
        "extra": [row.extra_deliveries for row in by_event_id.values()],
        "group": group,
        "now": now,
    }
    with _binary_cursor() as cursor:
        cursor.execute(_LOOKUP_SQL, params)
        found = cursor.fetchall()
    counted = found[0][-1] if found else 0
    for event_id, pk, status, attempts, duplicate_count, new_pk, _ in found:
        row = by_event_id[event_id]
        if pk is None:
            row.pk = new_pk
        else:
            row.pk, row.existed = pk, True
            existing[event_id] = _Existing(status, attempts, duplicate_count)
    if counted != len(existing):
        raise ConcurrentDelivery(
            f"{len(existing) - counted} row(s) of the batch were deleted by another "
            "transaction as this one looked them up; roll back and deliver the batch again."
        )
    return existing


def _insert(*, group: str, rows: Sequence[_Row], now: dt.datetime) -> None:
    """Inserts the new rows (_lookup() has counted the redelivery of the others).

    Raises ConcurrentDelivery when another transaction recorded one of the events (a
    consumer whose partitions moved on, say) after _lookup(), while this one ran its
    handlers. The caller's transaction must roll back; the batch is delivered again and then
    sees the other's row."""
    rows = [row for row in rows if not row.existed]
    if not rows:
        return
    params: dict[str, Any] = {
        "group": group,
        "now": now,
        "id": [row.pk for row in rows],
        "event_id": [row.record.event_id for row in rows],
        "topic": [row.record.topic for row in rows],
        "partition": [row.record.partition for row in rows],
        "offset": [row.record.offset for row in rows],
        "key": [row.record.key for row in rows],
        "event_type": [row.record.event_type for row in rows],
        "aggregate_type": [row.record.aggregate_type for row in rows],
        "aggregate_id": [row.record.aggregate_id for row in rows],
        "payload": [row.record.payload_json for row in rows],
        "headers": [json.dumps(row.record.headers) for row in rows],
        "raw_value": [row.record.raw_value for row in rows],
        "raw_value_encoding": [row.record.raw_value_encoding for row in rows],
        "status": [row.status for row in rows],
        "attempts": [row.attempts for row in rows],
        "next_attempt_at": [row.next_attempt_at for row in rows],
        "last_error": [row.last_error for row in rows],
        "published_at": [row.record.published_at for row in rows],
        "processed_at": [row.processed_at for row in rows],
        "duplicate_count": [row.extra_deliveries for row in rows],
        "released": [row.released for row in rows],
    }
    with _binary_cursor() as cursor:
        cursor.execute(_INSERT_SQL, params)
        inserted = dict(cursor.fetchall())
    changed = [event_id for event_id, was_inserted in inserted.items() if not was_inserted]
    if changed:
        raise ConcurrentDelivery(
            f"{len(changed)} event(s) of the batch, e.g. {changed[0]!r}, were recorded by "
            "another transaction while this one ran its handlers; roll back and deliver the "
            "batch again."
        )


def _message(
    *, group: str, record: InboxRecord, pk: int, attempts: int, duplicates: int, now: dt.datetime
) -> InboxMessage:
    message = InboxMessage(
        id=pk,
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
        status=PENDING,
        attempts=attempts,
        published_at=record.published_at,
        received_at=now,
        duplicate_count=duplicates,
    )
    message._state.adding = False
    message._state.db = connection.alias
    return message


@dataclass(slots=True)
class _BatchContext:
    group: str
    now: dt.datetime
    deduplicate: bool
    ordered: bool
    # Keys held (order per key): by an earlier batch's row, or by this batch's failures.
    held: set[tuple[str, str]]
    deadline: float | None
    # The batch's handler runs, written in one statement with the batch.
    attempts: list[Attempt] = field(default_factory=list)


def _record_row(
    row: _Row,
    before: _Existing | None,
    result: BatchResult,
    updates: list[tuple[int, *_State]],
    context: _BatchContext,
) -> tuple[str, BaseException | str | None]:
    """Decides one row's state, running its handler when it is due to run; counts it in
    `result`, and queues the update of a row that existed. Returns what became of it (and
    the error of a failure), for its span."""
    group, now, held, deadline = context.group, context.now, context.held, context.deadline
    deduplicate, ordered = context.deduplicate, context.ordered
    if before is None:
        result.inserted += 1
        result.duplicates += row.extra_deliveries
    else:
        result.duplicates += 1 + row.extra_deliveries
    if row.entry is None:
        if before is None:
            result.poison += 1
            return Outcome.POISON, row.last_error
        return Outcome.DUPLICATE, None
    sequence = (
        (row.record.topic, row.record.key) if ordered and row.record.key is not None else None
    )
    # A duplicate runs nothing, unless deduplication is off (then it runs again, which is
    # what exactly-once mode alone must make safe); one that waits for an operator, for
    # its turn in its key, or for a retry of its key's head, waits on.
    if before is not None and (
        deduplicate or before.status in (FAILED, PARKED) or sequence in held
    ):
        return Outcome.DUPLICATE, None
    attempts = 0 if before is None else before.attempts
    outcome: tuple[str, BaseException | str | None]
    if sequence in held:
        result.parked += 1
        state: _State = (PARKED, attempts, None, "", None)
        outcome = (Outcome.PARKED, None)
    elif deadline is not None and time.monotonic() > deadline:
        result.deferred += 1
        state = (PENDING, attempts, now, "", None)
        outcome = (Outcome.DEFERRED, None)
        if sequence is not None:
            held.add(sequence)
    else:
        message = _message(
            group=group,
            record=row.record,
            pk=row.pk,
            attempts=attempts,
            duplicates=row.extra_deliveries
            if before is None
            else before.duplicate_count + 1 + row.extra_deliveries,
            now=now,
        )
        error, seconds = _run_handler(row.entry, message)
        result.handler_seconds.append(seconds)
        finished = timezone.now()
        error_text = "" if error is None else format_error(error)
        context.attempts.append(
            attempt_of(
                message_id=row.pk,
                finished=finished,
                seconds=seconds,
                error=error,
                error_text=error_text,
                partition=row.record.partition,
                offset=row.record.offset,
                handler=row.entry.name,
            )
        )
        if error is None:
            result.processed += 1
            state = (DONE, attempts + 1, None, "", finished)
            outcome = (Outcome.PROCESSED, None)
            if row.record.published_at is not None:
                result.consume_lag_seconds.append(
                    (finished - row.record.published_at).total_seconds()
                )
        else:
            result.failed += 1
            status, next_attempt_at = _failure_state(attempts=attempts + 1, now=finished)
            state = (status, attempts + 1, next_attempt_at, error_text, None)
            outcome = (Outcome.FAILED, error)
            if sequence is not None:
                held.add(sequence)
    if before is None:
        row.status, row.attempts, row.next_attempt_at, row.last_error, row.processed_at = state
    else:
        updates.append((row.pk, *state))
    return outcome


def inbox_message_record_batch(
    *,
    group: str,
    records: Sequence[InboxRecord],
    registry: HandlerRegistry | None = None,
    exactly_once: bool = False,
    deduplicate: bool | None = None,
    unknown_event_type: str | None = None,
    deadline: float | None = None,
    member: str | None = None,
    track_positions: bool = False,
    check_positions: Mapping[tuple[str, int], int | None] | None = None,
) -> BatchResult:
    """Records a batch of records for `group` and runs the handlers of the new ones.

    Call inside transaction.atomic(): the inbox rows, the handlers' effects and (with
    `exactly_once`) the next offsets commit together. Each handler runs in a savepoint; a
    failure is recorded on its row and does not stop the batch. Handlers not started by
    `deadline` (time.monotonic()) are left PENDING and due now, for the retry task.

    With the group's ordering "key" (inbox.services.sequences), a new message whose key is
    held, by a row of an earlier batch or by one of this batch whose handler failed or was
    deferred, is recorded PARKED without running its handler.

    The batch's new rows are inserted after their handlers ran, so that processed_at is when
    each handler finished: a handler does not find its own row in the table. Raises
    ConcurrentDelivery (roll back, deliver again) if another transaction recorded one of the
    events meanwhile.

    Each handler run is an attempt row (inbox.models.InboxAttempt) of `member` (the
    consumer's, from inbox.services.attempts.attempt_member; by default the group's client.id
    at this process), written in the same transaction, one statement for the batch.

    With `track_positions` (the consumer's), the next offset of each partition is stored in
    the transaction as well, as exactly-once groups always do. Each partition that
    `check_positions` names and whose first record of the batch is past its stored next
    offset raises PositionGap before any handler runs, unless that stored offset is the
    partition's value in `check_positions` (the consumer read it again from there: the
    offsets between hold no record).
    """
    _require_atomic()
    registry = registry if registry is not None else get_registry()
    deduplicate = inbox_settings.DEDUPLICATE if deduplicate is None else deduplicate
    unknown_event_type = unknown_event_type or inbox_settings.UNKNOWN_EVENT_TYPE
    if unknown_event_type not in UNKNOWN_EVENT_TYPE_CHOICES:
        raise ImproperlyConfiguredInbox(
            f'INBOX["UNKNOWN_EVENT_TYPE"] is {unknown_event_type!r}; use "ignore" or "fail".'
        )
    result = BatchResult(consumed=len(records))
    if exactly_once or check_positions is not None:
        stored = consumer_offsets_lock(group=group, records=records)
        if check_positions is not None:
            _check_positions(records, stored, check_positions)
        if exactly_once:
            fresh = [r for r in records if r.offset >= stored[(r.topic, r.partition)]]
            result.skipped = len(records) - len(fresh)
            records = fresh
    next_offsets: dict[tuple[str, int], int] = {}
    for record in records:
        key = (record.topic, record.partition)
        next_offsets[key] = max(next_offsets.get(key, 0), record.offset + 1)

    now = timezone.now()
    rows = _classify(
        group=group,
        records=records,
        registry=registry,
        unknown_event_type=unknown_event_type,
        result=result,
    )
    held: set[tuple[str, str]] = set()
    ordered = group_ordering(group) == "key"
    if ordered:
        held = held_sequences(
            group,
            {
                (row.record.topic, row.record.key)
                for row in rows
                if row.entry is not None and row.record.key is not None
            },
        )
    existing = _lookup(group=group, rows=rows, now=now) if rows else {}

    # Rows that existed and whose handler ran again (deduplication off): updated in place.
    updates: list[tuple[int, *_State]] = []
    context = _BatchContext(
        group=group,
        now=now,
        deduplicate=deduplicate,
        ordered=ordered,
        held=held,
        deadline=deadline,
    )
    # A process span per row when tracing is on: asked once per batch.
    tracer = active_tracer()
    for row in rows:
        before = existing.get(row.record.event_id)
        if tracer is None:
            _record_row(row, before, result, updates, context)
            continue
        span = process_span(tracer, group=group, record=row.record, duplicate=before is not None)
        if row.extra_deliveries:
            span.set_attribute("inbox.redeliveries", row.extra_deliveries)
        with running_in(span) as end:
            end.outcome, end.error = _record_row(row, before, result, updates, context)
    if rows:
        _insert(group=group, rows=rows, now=now)
    if updates:
        states_update(updates)
    inbox_attempts_insert(
        attempts=context.attempts, member=member or attempt_member(f"inbox-{group}")
    )
    if exactly_once or track_positions:
        consumer_offsets_advance(group=group, next_offsets=next_offsets)
    return result


def _check_positions(
    records: Sequence[InboxRecord],
    stored: dict[tuple[str, int], int],
    read_again_from: Mapping[tuple[str, int], int | None],
) -> None:
    first: dict[tuple[str, int], int] = {}
    for record in records:
        key = (record.topic, record.partition)
        first[key] = min(first.get(key, record.offset), record.offset)
    gaps = {
        key: stored[key]
        for key, offset in first.items()
        if key in read_again_from and offset > stored[key] and read_again_from[key] != stored[key]
    }
    if gaps:
        raise PositionGap(gaps, first)
