"""publish(): records an event in the caller's database transaction, having checked it."""

import json
import re
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

import psycopg
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from outbox.conf import outbox_settings
from outbox.errors import (
    DuplicateEvent,
    InvalidEvent,
    InvalidPayload,
    NotInTransaction,
    PayloadTooLarge,
)
from outbox.ids import drawn_time_range, time_ordered_event_id
from outbox.models import OutboxEvent
from outbox.services.nudge import nudge_relay_on_commit
from outbox.tracing import publish_span

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


# One encoder for every publish: json.dumps(cls=...) would build one per call.
PAYLOAD_ENCODER = DjangoJSONEncoder(ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


def encode_payload(payload: Any) -> bytes:
    """The payload as UTF-8 JSON, spaced as PostgreSQL prints jsonb (the relay sends that
    text), so that the size limit counts what goes to Kafka."""
    try:
        text = PAYLOAD_ENCODER.encode(payload)
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
            topic = outbox_settings.TOPIC_TEMPLATE.format(
                aggregate_type=aggregate_type, event_type=event_type
            )
        except (KeyError, IndexError) as error:
            raise InvalidEvent(
                f'OUTBOX["TOPIC_TEMPLATE"] {outbox_settings.TOPIC_TEMPLATE!r} uses an unknown '
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
    return resolved


def _resolve_event_id(event_id: uuid.UUID | str | None, created_at: datetime) -> uuid.UUID:
    if event_id is None:
        return time_ordered_event_id(created_at)
    if isinstance(event_id, uuid.UUID):
        return event_id
    try:
        return uuid.UUID(str(event_id))
    except ValueError as error:
        raise InvalidEvent(f"event_id {event_id!r} is not a UUID.") from error


# Every column publish() sets; the others take their defaults (the sequence, the transaction id).
PUBLISH_SQL = """
INSERT INTO outbox_event (id, aggregatetype, aggregateid, type, payload, headers, topic, key,
                          created_at)
VALUES (%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s, %s)
RETURNING position, txid::text
"""
# A caller's own event id may repeat one already recorded. The event table, partitioned by
# day, has no unique index on the id. The given ids' table has one (migration 0015 copied
# there the ids of the events from before partitioning), and a concurrent publish of the same
# id waits for this transaction there. An id drawn from the clock (by publish(), or by the
# model's default) is not in that table: a time-ordered id is looked for among the events of
# its own time (outbox.ids.drawn_time_range: one partition, a few BRIN ranges); any other id
# was never drawn. The statement does not fail, so the
# caller's transaction stays usable after a DuplicateEvent. An id publish() draws, new, skips
# it.
CLAIM_GIVEN_ID_SQL = """
INSERT INTO outbox_event_given_id (id, created_at)
SELECT %(id)s, %(created_at)s
WHERE NOT EXISTS (
    SELECT 1 FROM outbox_event
    WHERE id = %(id)s AND created_at >= %(drawn_from)s AND created_at < %(drawn_until)s
)
ON CONFLICT (id) DO NOTHING
"""


# Where Django's connection (one per thread) keeps its prepared-statement cursor.
PREPARED_CURSOR_ATTRIBUTE = "outbox_publish_cursor"


class _PreparedStatementCursor(psycopg.Cursor[Any]):
    """Binds parameters on the server and prepares each statement on its first run, so that
    PostgreSQL parses and plans publish()'s INSERT once per connection. Django's cursors bind
    on the client, and Django turns psycopg's automatic preparing off: every INSERT into the
    partitioned event table would be parsed and planned again (about 15 % of a publish's
    time, measured with raw psycopg beside bench-outbox's bare insert)."""

    def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
        return super().execute(query, params, prepare=True, **options)


@contextmanager
def _publish_cursor() -> Iterator[CursorWrapper]:
    """A cursor on Django's connection, in the caller's transaction, whose statements Django's
    execute wrappers see. Prepared statements unless OUTBOX["PUBLISH_PREPARED"] is off (a
    transaction-mode pooler that cannot keep them, PgBouncer before 1.21 or with
    max_prepared_statements at 0, needs it off), or while Django logs queries (DEBUG, a test
    capturing them): its log shows a statement with its values only from its own cursors."""
    if not outbox_settings.PUBLISH_PREPARED or connection.queries_logged:
        with connection.cursor() as cursor:
            yield cursor
        return
    yield _prepared_cursor()


def _prepared_cursor() -> CursorWrapper:
    """The connection's one prepared-statement cursor, made on its first publish and kept
    while the database connection lasts: making one for every publish cost it about a tenth
    of its time (bench-outbox's publish beside a bare insert)."""
    connection.ensure_connection()
    database_connection = connection.connection
    kept: CursorWrapper | None = getattr(connection, PREPARED_CURSOR_ATTRIBUTE, None)
    if kept is not None and kept.cursor.connection is database_connection:
        return kept
    if database_connection.prepare_threshold is None:
        # Django's default; psycopg then refuses even an explicit prepare. A threshold no
        # statement reaches allows the explicit ones only: Django's own cursors never prepare.
        database_connection.prepare_threshold = sys.maxsize
    # django-stubs type these as taking a CursorWrapper; they take a DB-API cursor.
    kept = connection.make_cursor(
        cast(CursorWrapper, _PreparedStatementCursor(database_connection))
    )
    setattr(connection, PREPARED_CURSOR_ATTRIBUTE, kept)
    return kept


# The model's fields in its order, in which Model.from_db() takes their values.
PUBLISHED_FIELDS = [field.attname for field in OutboxEvent._meta.concrete_fields]


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
    if len(encoded) > outbox_settings.MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f'The encoded payload is {len(encoded)} bytes; OUTBOX["MAX_PAYLOAD_BYTES"] allows '
            f"{outbox_settings.MAX_PAYLOAD_BYTES}. Store large documents elsewhere and publish "
            "a reference to them."
        )
    created_at = timezone.now()
    event_uuid = _resolve_event_id(event_id, created_at)
    resolved_headers = _resolve_headers(headers)
    topic = _resolve_topic(topic, aggregate_type=aggregate_type, event_type=event_type)
    # One statement written by hand rather than Model.save(): publish() runs in the business
    # transaction of every caller, and save() costs about as much CPU again (the payload
    # encoded twice more, the INSERT compiled each time). The span (with an SDK) covers the
    # insert; the headers stored get the event's creation context (outbox.tracing).
    with (
        publish_span(topic=topic, key=key, event_id=event_uuid, headers=resolved_headers),
        _publish_cursor() as cursor,
    ):
        if event_id is not None:
            drawn_from, drawn_until = drawn_time_range(event_uuid)
            cursor.execute(
                CLAIM_GIVEN_ID_SQL,
                {
                    "id": event_uuid,
                    "created_at": created_at,
                    "drawn_from": drawn_from,
                    "drawn_until": drawn_until,
                },
            )
            if cursor.rowcount == 0:
                raise DuplicateEvent(
                    f"An event with id {event_uuid} already exists; an event id is used once."
                )
        cursor.execute(
            PUBLISH_SQL,
            [
                event_uuid,
                aggregate_type,
                aggregate_id,
                event_type,
                encoded.decode("utf-8"),
                json.dumps(resolved_headers),
                topic,
                key,
                created_at,
            ],
        )
        position, transaction_id = cursor.fetchone()
    stored = {
        "id": event_uuid,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "event_type": event_type,
        # What is stored is exactly what the relay will send: the JSON of the encoded bytes.
        "payload": json.loads(encoded),
        "headers": resolved_headers,
        "topic": topic,
        "key": key,
        "created_at": created_at,
        "position": position,
        "transaction_id": int(transaction_id),
    }
    # As if read back: every field given, so the model computes no defaults.
    event = OutboxEvent.from_db(
        connection.alias, PUBLISHED_FIELDS, [stored[name] for name in PUBLISHED_FIELDS]
    )
    if outbox_settings.NUDGE_ON_COMMIT:
        nudge_relay_on_commit()
    return event
