"""Writes to the outbox: publish() for business code, claim and mark for the relay, and the
operator's repairs. Marking a batch takes one statement per outcome, never one per row."""

import functools
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Func, Q, Value
from django.utils import timezone

from outbox.errors import (
    DuplicateEvent,
    IllegalTransition,
    InvalidEvent,
    InvalidPayload,
    NotInTransaction,
    PayloadTooLarge,
)
from outbox.models import POSITION_SEQUENCE, OutboxEvent
from outbox.tracing import TRACEPARENT_HEADER, caller_traceparent

# Kafka's legal topic names: ASCII letters, digits, '.', '_' and '-', at most 249 characters.
TOPIC_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
IDENTIFIER_MAX_LENGTH = 255
# Headers every record carries; an event's own headers may not replace them.
STANDARD_HEADERS = frozenset(
    {"event_id", "event_type", "aggregate_type", "aggregate_id", "created_at", "content-type"}
)


# An escaped NUL in JSON text (an odd run of backslashes before u0000): jsonb refuses it.
JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _storable_text_problem(text: str) -> str | None:
    """Why PostgreSQL or Kafka could not take `text` as it is, or None."""
    if "\x00" in text:
        return "contains a NUL character, which PostgreSQL text cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which is not valid UTF-8"
    return None


def encode_payload(payload: Any) -> bytes:
    """The payload as UTF-8 JSON, spaced as PostgreSQL prints jsonb (the relay sends that
    text), so that the size limit counts what goes to Kafka."""
    try:
        text = json.dumps(
            payload,
            cls=DjangoJSONEncoder,
            ensure_ascii=False,
            allow_nan=False,
            separators=(", ", ": "),
        )
    except (TypeError, ValueError) as error:
        raise InvalidPayload(
            f"The payload is not JSON-serialisable ({error}). Pass dicts, lists, strings, "
            "numbers, booleans, None, or values Django's JSON encoder knows (dates, "
            "decimals, UUIDs)."
        ) from error
    # json.dumps escapes control characters, so a NUL can only appear escaped.
    if "\\u0000" in text and JSON_NUL.search(text):
        raise InvalidPayload(
            "The payload contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot "
            "store; remove it, or encode binary data (base64)."
        )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidPayload(
            f"The payload contains a lone surrogate, which is not valid UTF-8 ({error})."
        ) from error


def _require_identifier(name: str, value: Any) -> str:
    text = "" if value is None else str(value)
    if not text.strip():
        raise InvalidEvent(f"{name} must not be empty.")
    if len(text) > IDENTIFIER_MAX_LENGTH:
        raise InvalidEvent(
            f"{name} is {len(text)} characters long; the limit is {IDENTIFIER_MAX_LENGTH}."
        )
    problem = _storable_text_problem(text)
    if problem is not None:
        raise InvalidEvent(f"{name} {problem}.")
    return text


def _resolve_topic(topic: str | None, *, aggregate_type: str, event_type: str) -> str:
    if topic is None:
        try:
            topic = settings.OUTBOX_TOPIC_TEMPLATE.format(
                aggregate_type=aggregate_type, event_type=event_type
            )
        except (KeyError, IndexError) as error:
            raise InvalidEvent(
                f"OUTBOX_TOPIC_TEMPLATE {settings.OUTBOX_TOPIC_TEMPLATE!r} uses an unknown "
                f"field {error}; it may use {{aggregate_type}} and {{event_type}}."
            ) from error
    if not TOPIC_NAME_PATTERN.match(topic) or topic in (".", ".."):
        raise InvalidEvent(
            f"Kafka would refuse the topic name {topic!r}: use 1 to 249 ASCII letters, digits, "
            "'.', '_' or '-' (and not '.' or '..')."
        )
    return topic


def _resolve_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    resolved: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not name:
            raise InvalidEvent(f"Header names must be non-empty strings, got {name!r}.")
        if name in STANDARD_HEADERS:
            raise InvalidEvent(
                f"The header {name!r} is set by the outbox itself; choose another name."
            )
        if not isinstance(value, str):
            raise InvalidEvent(
                f"The value of header {name!r} must be a string, got {type(value).__name__}."
            )
        problem = _storable_text_problem(name) or _storable_text_problem(value)
        if problem is not None:
            raise InvalidEvent(f"The header {name!r} {problem}.")
        resolved[name] = value
    if TRACEPARENT_HEADER not in resolved:
        traceparent = caller_traceparent()
        if traceparent:
            resolved[TRACEPARENT_HEADER] = traceparent
    return resolved


def _resolve_event_id(event_id: uuid.UUID | str | None) -> uuid.UUID:
    if event_id is None:
        return uuid.uuid4()
    if isinstance(event_id, uuid.UUID):
        return event_id
    try:
        return uuid.UUID(str(event_id))
    except ValueError as error:
        raise InvalidEvent(f"event_id {event_id!r} is not a UUID.") from error


# Every column publish() sets; the others take their defaults (NULL or the sequence).
PUBLISH_SQL = """
INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic, key,
                          status, attempts, next_attempt_at, last_error, created_at,
                          updated_at, locked_by)
VALUES (%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s, 'PENDING', 0, %s, '', %s, %s, '')
ON CONFLICT (id) DO NOTHING
RETURNING position
"""


def outbox_event_publish(
    *,
    aggregate_type: str,
    aggregate_id: Any,
    event_type: str,
    payload: Any,
    topic: str | None = None,
    key: str | None = None,
    headers: Mapping[str, Any] | None = None,
    event_id: uuid.UUID | str | None = None,
) -> OutboxEvent:
    """Records an event in the caller's database transaction.

    Call inside `transaction.atomic()`: the event exists only if that transaction commits.
    Raises an OutboxError subclass, having written nothing, when the input is bad.
    """
    if not transaction.get_connection().in_atomic_block:
        raise NotInTransaction(
            "outbox.publish() must run inside transaction.atomic(), so that the event commits "
            "or rolls back with the business change it describes."
        )
    aggregate_type = _require_identifier("aggregate_type", aggregate_type)
    aggregate_id = _require_identifier("aggregate_id", aggregate_id)
    event_type = _require_identifier("event_type", event_type)
    key = aggregate_id if key is None else _require_identifier("key", key)
    encoded = encode_payload(payload)
    if len(encoded) > settings.OUTBOX_MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"The encoded payload is {len(encoded)} bytes; OUTBOX_MAX_PAYLOAD_BYTES allows "
            f"{settings.OUTBOX_MAX_PAYLOAD_BYTES}. Store large documents elsewhere and publish "
            "a reference to them."
        )
    event = OutboxEvent(
        id=_resolve_event_id(event_id),
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        event_type=event_type,
        # What is stored is exactly what the relay will send: the JSON of the encoded bytes.
        payload=json.loads(encoded),
        headers=_resolve_headers(headers),
        topic=_resolve_topic(topic, aggregate_type=aggregate_type, event_type=event_type),
        key=key,
    )
    event.created_at = event.next_attempt_at = event.updated_at = timezone.now()
    # One statement written by hand rather than Model.save(): publish() runs in the business
    # transaction of every caller, and save() costs about as much CPU again (the payload
    # encoded twice more, the INSERT compiled each time). ON CONFLICT tells a repeated event
    # id without a savepoint, and the caller's transaction stays usable.
    with connection.cursor() as cursor:
        cursor.execute(
            PUBLISH_SQL,
            [
                event.id,
                event.aggregate_type,
                event.aggregate_id,
                event.event_type,
                encoded.decode("utf-8"),
                json.dumps(event.headers),
                event.topic,
                event.key,
                event.next_attempt_at,
                event.created_at,
                event.updated_at,
            ],
        )
        inserted = cursor.fetchone()
    if inserted is None:
        raise DuplicateEvent(
            f"An event with id {event.id} already exists; an event id is used once."
        )
    event.position = inserted[0]
    event._state.adding = False
    event._state.db = connection.alias
    if settings.OUTBOX_NUDGE_ON_COMMIT:
        _nudge_relay_on_commit()
    return event


NUDGE_EXPIRES_SECONDS = 5.0


def _nudge_relay_on_commit() -> None:
    # One nudge per transaction, however many events it publishes.
    if any(entry[1] is _send_relay_nudge for entry in connection.run_on_commit):
        return
    transaction.on_commit(_send_relay_nudge, robust=True)


_last_nudge_at = 0.0


def _send_relay_nudge() -> None:
    from outbox.tasks import relay

    # At most one nudge per OUTBOX_NUDGE_MIN_INTERVAL_MS: under load, a relay run started by
    # the previous nudge is still looping over the new events, and a flood of nudges would
    # only queue empty runs that take CPU from the work. A skipped nudge waits at most for
    # the next one or the next beat tick; the outbox table, not the nudge, is the source of
    # truth. Checked in this process first (free), then across all processes (Redis).
    global _last_nudge_at
    interval_ms = settings.OUTBOX_NUDGE_MIN_INTERVAL_MS
    now = time.monotonic()
    if now - _last_nudge_at < interval_ms / 1000:
        return
    _last_nudge_at = now
    if not _take_shared_nudge_slot(interval_ms):
        return
    # A nudge still queued after NUDGE_EXPIRES_SECONDS is dropped: beat's tick has come since.
    relay.apply_async(ignore_result=True, retry=False, expires=NUDGE_EXPIRES_SECONDS)


def relay_nudge_key() -> str:
    # Per database: relays of other databases sharing the Redis are not held back.
    return f"outbox:relay-nudge:{connection.settings_dict['NAME']}"


@functools.cache
def _broker_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def _take_shared_nudge_slot(interval_ms: int) -> bool:
    """True for the first caller in all processes within `interval_ms`. A broker that is not
    Redis, or a Redis that does not answer, does not hold nudges back (apply_async then
    reports the broker's state as it always did)."""
    url = settings.CELERY_BROKER_URL
    if interval_ms <= 0 or not url.startswith(("redis://", "rediss://")):
        return True
    try:
        return bool(_broker_redis(url).set(relay_nudge_key(), 1, nx=True, px=interval_ms))
    except redis.RedisError:
        return True


# --- the relay's claim and marks ------------------------------------------------------------

# Which rows a claim may take: due, PENDING, not leased to a live relay.
_CLAIMABLE = """
    event.status = 'PENDING'
    AND event.next_attempt_at <= now()
    AND (event.locked_until IS NULL OR event.locked_until < now())
"""

# A claim finds its events first, without locking anything, then leases them by id. The
# finding queries probe the table; a locking query that did the same would re-run them
# for every row another relay changed meanwhile (PostgreSQL re-checks a changed row against
# the whole query), and relays claiming side by side then spent minutes per claim. Leasing by
# id re-checks only the row itself.
#
# The first pass: among the oldest claimable events, those that are the next of their key.
# It looks at no more than %(window)s rows: past them, a backlog queued deep on a few keys
# whose next events are out with another relay would be probed row by row in vain. Neither
# pass joins the table to itself: a first pass that did ran for 149 s in a fault scenario
# (celery-redis), where a plain probe per row takes milliseconds.
CLAIM_OLDEST_SQL = f"""
SELECT oldest.id, oldest.position
FROM (
    SELECT event.id, event.topic, event.key, event.position
    FROM outbox_event AS event
    WHERE {_CLAIMABLE}
    ORDER BY event.position
    LIMIT %(window)s
) AS oldest
-- Order per key: only the oldest undelivered event of a (topic, key) may go out.
WHERE NOT EXISTS (
    SELECT 1 FROM outbox_event AS earlier
    WHERE earlier.topic = oldest.topic
      AND earlier.key = oldest.key
      AND earlier.position < oldest.position
      AND earlier.status <> 'DONE'
      AND earlier.discarded_at IS NULL
)
ORDER BY oldest.position
LIMIT %(batch_size)s
"""  # noqa: S608 (composed of the constants above, no input)

# The second pass, when the first did not fill the batch: the oldest undelivered event of
# every (topic, key), read in one ordered walk of outbox_event_undelivered_idx (about a
# microsecond a row), and of those the claimable ones. A key whose oldest undelivered event
# is FAILED, waiting for its retry or out with a relay is skipped whole.
CLAIM_HEADS_SQL = f"""
SELECT event.id, event.position
FROM (
    SELECT DISTINCT ON (topic, key) id, position, status, next_attempt_at, locked_until
    FROM outbox_event
    WHERE status <> 'DONE' AND discarded_at IS NULL
    ORDER BY topic, key, position
) AS event
WHERE {_CLAIMABLE}
ORDER BY event.position
LIMIT %(batch_size)s
"""  # noqa: S608 (composed of the constants above, no input)

# The lease: the found events that are still claimable once locked (another relay may have
# taken or published one since), skipping those another claim holds.
CLAIM_LEASE_SQL = f"""
WITH candidates AS (
    SELECT event.id
    FROM outbox_event AS event
    WHERE event.id = ANY(%(ids)s::uuid[]) AND {_CLAIMABLE}
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_event AS event
SET locked_until = now() + make_interval(secs => %(lease_seconds)s),
    locked_by = %(relay_id)s
FROM candidates
WHERE event.id = candidates.id
RETURNING event.id, event.aggregatetype, event.aggregateid, event.type, event.payload::text,
          event.headers, event.topic, event.key, event.created_at, event.attempts,
          event.position
"""  # noqa: S608 (composed of the constants above, no input)
# Rows the first pass examines, per row of the batch.
CLAIM_WINDOW_FACTOR = 2


@dataclass(frozen=True, slots=True)
class ClaimedEvent:
    id: uuid.UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    # The stored JSON as PostgreSQL prints it: sent as it is, never parsed on the hot path.
    payload_json: str
    headers: dict[str, str]
    topic: str
    key: str
    created_at: datetime
    attempts: int
    position: int


@dataclass(frozen=True, slots=True)
class Delivery:
    event_id: uuid.UUID
    partition: int
    offset: int
    published_at: datetime


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    event_id: uuid.UUID
    error: str


def outbox_events_claim(*, relay_id: str, batch_size: int) -> list[ClaimedEvent]:
    """Leases up to batch_size due events to relay_id, in a transaction of its own."""
    parameters = {"batch_size": batch_size, "window": batch_size * CLAIM_WINDOW_FACTOR}
    with transaction.atomic(), connection.cursor() as cursor:
        # A claim is a short query run many times a second: compiling it (JIT) costs more
        # than it saves, whatever the planner estimates for a large backlog.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(CLAIM_OLDEST_SQL, parameters)
        found = dict(cursor.fetchall())
        if len(found) < batch_size:
            # The walk of the index in key order is what makes this pass cheap; a planner
            # that expects many rows would rather scan the table and sort it.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute(CLAIM_HEADS_SQL, parameters)
            found.update(cursor.fetchall())
        if not found:
            return []
        oldest_first = sorted(found, key=found.__getitem__)[:batch_size]
        cursor.execute(
            CLAIM_LEASE_SQL,
            {
                "ids": oldest_first,
                "lease_seconds": settings.OUTBOX_LEASE_SECONDS,
                "relay_id": relay_id,
            },
        )
        rows = cursor.fetchall()
    events = [
        ClaimedEvent(
            id=row[0],
            aggregate_type=row[1],
            aggregate_id=row[2],
            event_type=row[3],
            payload_json=row[4],
            headers=json.loads(row[5]) if isinstance(row[5], str) else row[5],
            topic=row[6],
            key=row[7],
            created_at=row[8],
            attempts=row[9],
            position=row[10],
        )
        for row in rows
    ]
    # The UPDATE returns rows in no particular order; the producer must send them by position.
    events.sort(key=lambda event: event.position)
    return events


def outbox_events_mark_published(*, deliveries: Sequence[Delivery]) -> int:
    if not deliveries:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE outbox_event AS event
            SET status = 'DONE', attempts = event.attempts + 1, last_error = '',
                published_at = delivery.published_at, kafka_partition = delivery.partition,
                kafka_offset = delivery.kafka_offset, locked_until = NULL, locked_by = '',
                updated_at = now()
            FROM unnest(%s::uuid[], %s::integer[], %s::bigint[], %s::timestamptz[])
                 AS delivery(id, partition, kafka_offset, published_at)
            WHERE event.id = delivery.id AND event.status = 'PENDING'
            """,
            [
                [d.event_id for d in deliveries],
                [d.partition for d in deliveries],
                [d.offset for d in deliveries],
                [d.published_at for d in deliveries],
            ],
        )
        return cursor.rowcount


def outbox_events_mark_failed(*, relay_id: str, failures: Sequence[DeliveryFailure]) -> int:
    """Counts a failed attempt; schedules the next one by exponential backoff with jitter,
    or marks the event FAILED after OUTBOX_MAX_ATTEMPTS."""
    if not failures:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE outbox_event AS event
            SET attempts = event.attempts + 1,
                last_error = failure.error,
                status = CASE WHEN event.attempts + 1 >= %(max_attempts)s
                              THEN 'FAILED' ELSE 'PENDING' END,
                -- "Equal jitter": half the exponential delay, plus up to as much again at random.
                next_attempt_at = now() + make_interval(secs =>
                    LEAST(%(max_seconds)s, %(base_seconds)s * power(2, event.attempts))
                    * (0.5 + random() / 2)),
                locked_until = NULL, locked_by = '', updated_at = now()
            FROM unnest(%(ids)s::uuid[], %(errors)s::text[]) AS failure(id, error)
            WHERE event.id = failure.id AND event.status = 'PENDING'
              AND event.locked_by = %(relay_id)s
            """,
            {
                "max_attempts": settings.OUTBOX_MAX_ATTEMPTS,
                "max_seconds": settings.OUTBOX_RETRY_MAX_SECONDS,
                "base_seconds": settings.OUTBOX_RETRY_BASE_SECONDS,
                "ids": [f.event_id for f in failures],
                "errors": [f.error for f in failures],
                "relay_id": relay_id,
            },
        )
        return cursor.rowcount


def outbox_events_release(*, relay_id: str, event_ids: Sequence[uuid.UUID]) -> int:
    """Gives claimed events back untouched, for another attempt as soon as a relay is ready."""
    if not event_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE outbox_event SET locked_until = NULL, locked_by = '', updated_at = now()
            WHERE id = ANY(%s::uuid[]) AND status = 'PENDING' AND locked_by = %s
            """,
            [list(event_ids), relay_id],
        )
        return cursor.rowcount


def outbox_events_purge_published(*, older_than: datetime, batch_size: int) -> int:
    """Deletes DONE events published before older_than, one bounded batch per transaction."""
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                DELETE FROM outbox_event WHERE id IN (
                    SELECT id FROM outbox_event
                    WHERE status = 'DONE' AND published_at < %s
                    LIMIT %s FOR UPDATE SKIP LOCKED
                )
                """,
                [older_than, batch_size],
            )
            batch = cursor.rowcount
        deleted += batch
        if batch < batch_size:
            return deleted


# --- operators' repairs ----------------------------------------------------------------------
# Each refuses an illegal transition with IllegalTransition. The console records who did what.

REPLAY_OF_HEADER = "replay_of"


def _not_leased() -> Q:
    # A row a relay holds may be on its way to Kafka right now: clearing its lease would let
    # another relay send it a second time. Its outcome (DONE, or a retry) comes soon enough.
    return Q(locked_until__isnull=True) | Q(locked_until__lt=timezone.now())


def outbox_event_retry(*, event: OutboxEvent) -> OutboxEvent:
    """Sends a FAILED event (or a PENDING one waiting for its backoff) again, now, with a
    fresh set of attempts. An event a relay is sending at this moment is left to it."""
    if event.status == OutboxEvent.Status.DONE:
        raise IllegalTransition(
            f"Event {event.id} is already published; replay it instead of retrying it."
        )
    if event.discarded_at is not None:
        raise IllegalTransition(f"Event {event.id} was discarded; replay it to send it again.")
    updated = (
        OutboxEvent.objects.filter(_not_leased(), pk=event.pk, discarded_at__isnull=True)
        .exclude(status=OutboxEvent.Status.DONE)
        .update(
            status=OutboxEvent.Status.PENDING,
            attempts=0,
            next_attempt_at=timezone.now(),
            locked_until=None,
            locked_by="",
        )
    )
    if not updated:
        if OutboxEvent.objects.filter(pk=event.pk).exclude(_not_leased()).exists():
            raise IllegalTransition(
                f"Event {event.id} is being sent by a relay right now; its outcome is recorded "
                "within the lease, retry it after that if it is not DONE."
            )
        raise IllegalTransition(f"Event {event.id} changed meanwhile; nothing to retry.")
    event.refresh_from_db()
    return event


def outbox_event_discard(*, event: OutboxEvent) -> OutboxEvent:
    """Gives up on a FAILED event. The row stays for audit; its key's later events flow on."""
    if event.status != OutboxEvent.Status.FAILED:
        raise IllegalTransition(
            f"Only FAILED events can be discarded; event {event.id} is {event.status}."
        )
    updated = OutboxEvent.objects.filter(
        pk=event.pk, status=OutboxEvent.Status.FAILED, discarded_at__isnull=True
    ).update(discarded_at=timezone.now())
    if not updated:
        raise IllegalTransition(f"Event {event.id} is already discarded.")
    event.refresh_from_db()
    return event


def outbox_event_replay(*, event: OutboxEvent, new_event_id: bool) -> OutboxEvent:
    """Publishes a DONE (or discarded) event again.

    With the same event id, consumers recognise the copy and count it as a duplicate; with
    a new event id they process it again, and the header `replay_of` names the original.
    """
    if event.status != OutboxEvent.Status.DONE and event.discarded_at is None:
        raise IllegalTransition(
            f"Only published or discarded events can be replayed; event {event.id} is "
            f"{event.status}: retry it instead."
        )
    if new_event_id:
        with transaction.atomic():
            return outbox_event_publish(
                aggregate_type=event.aggregate_type,
                aggregate_id=event.aggregate_id,
                event_type=event.event_type,
                payload=event.payload,
                topic=event.topic,
                key=event.key,
                headers={**event.headers, REPLAY_OF_HEADER: str(event.id)},
            )
    previous = (
        f"replayed by an operator; previously published to partition {event.kafka_partition} "
        f"at offset {event.kafka_offset} on {event.published_at}"
        if event.status == OutboxEvent.Status.DONE
        else "replayed by an operator after being discarded"
    )
    # Back into the queue behind the key's current events: a replay is a new publication.
    with transaction.atomic():
        updated = (
            OutboxEvent.objects.filter(pk=event.pk)
            .filter(Q(status=OutboxEvent.Status.DONE) | Q(discarded_at__isnull=False))
            .update(
                status=OutboxEvent.Status.PENDING,
                attempts=0,
                last_error=previous,
                next_attempt_at=timezone.now(),
                discarded_at=None,
                locked_until=None,
                locked_by="",
                position=Func(Value(POSITION_SEQUENCE), function="nextval"),
            )
        )
    if not updated:
        raise IllegalTransition(f"Event {event.id} changed meanwhile; nothing to replay.")
    event.refresh_from_db()
    return event


def outbox_key_release(*, topic: str, key: str) -> int:
    """Lets a quarantined key flow again: discards its FAILED events and makes an event
    waiting for its backoff due now. Returns how many events it changed."""
    now = timezone.now()
    with transaction.atomic():
        discarded = OutboxEvent.objects.filter(
            topic=topic, key=key, status=OutboxEvent.Status.FAILED, discarded_at__isnull=True
        ).update(discarded_at=now)
        made_due = OutboxEvent.objects.filter(
            topic=topic, key=key, status=OutboxEvent.Status.PENDING, next_attempt_at__gt=now
        ).update(next_attempt_at=now)
    return discarded + made_due


# --- the console: bulk repairs and the audit log -----------------------------------------------
# A bulk repair changes the rows its single-row counterpart would, in one statement per chunk:
# the console runs it over ids frozen when the operator submitted.

from django.db.models import F  # noqa: E402
from django.db.models.functions import Greatest  # noqa: E402

from outbox.models import OperatorAction  # noqa: E402


def outbox_events_retry(*, event_ids: Sequence[uuid.UUID | str]) -> int:
    """outbox_event_retry() for many events: the ones not DONE, not discarded and not being
    sent by a relay are sent again now, with a fresh set of attempts. Returns how many
    changed."""
    if not event_ids:
        return 0
    return (
        OutboxEvent.objects.filter(_not_leased(), pk__in=list(event_ids), discarded_at__isnull=True)
        .exclude(status=OutboxEvent.Status.DONE)
        .update(
            status=OutboxEvent.Status.PENDING,
            attempts=0,
            next_attempt_at=timezone.now(),
            locked_until=None,
            locked_by="",
            updated_at=timezone.now(),
        )
    )


def outbox_events_discard(*, event_ids: Sequence[uuid.UUID | str]) -> int:
    """outbox_event_discard() for many events: FAILED ones are kept for audit, discarded."""
    if not event_ids:
        return 0
    return OutboxEvent.objects.filter(
        pk__in=list(event_ids), status=OutboxEvent.Status.FAILED, discarded_at__isnull=True
    ).update(discarded_at=timezone.now(), updated_at=timezone.now())


def outbox_events_replay(*, event_ids: Sequence[uuid.UUID | str], new_event_id: bool) -> int:
    """outbox_event_replay() for each DONE or discarded event; others are skipped."""
    replayed = 0
    events = OutboxEvent.objects.filter(pk__in=list(event_ids)).filter(
        Q(status=OutboxEvent.Status.DONE) | Q(discarded_at__isnull=False)
    )
    for event in events.order_by("position"):
        try:
            outbox_event_replay(event=event, new_event_id=new_event_id)
        except IllegalTransition:
            continue  # changed by someone else meanwhile
        replayed += 1
    return replayed


def operator_action_record(
    *,
    user: Any,
    action: str,
    model: str,
    source: str,
    requested: int,
    changed: int = 0,
    object_ids: Sequence[Any] = (),
    filters: Mapping[str, Any] | None = None,
    note: str = "",
    chunks_pending: int = 0,
) -> OperatorAction:
    """Writes one entry of the console's audit log."""
    return OperatorAction.objects.create(
        user=user if getattr(user, "pk", None) else None,
        username=getattr(user, "get_username", lambda: "")() or "anonymous",
        action=action,
        model=model,
        source=source,
        requested=requested,
        changed=changed,
        object_ids=[str(value) for value in list(object_ids)[: OperatorAction.MAX_STORED_IDS]],
        filters=dict(filters or {}),
        note=note,
        chunks_pending=chunks_pending,
    )


def operator_action_add_progress(*, action_id: int, changed: int, chunks_done: int = 0) -> None:
    """Adds the rows a chunk of a queued action changed, and counts the chunk as done."""
    OperatorAction.objects.filter(pk=action_id).update(
        changed=F("changed") + changed,
        chunks_pending=Greatest(F("chunks_pending") - chunks_done, Value(0)),
    )
