"""Kafka records as the inbox reads them: headers, key, payload, or why the record is poison.

Pure functions over confluent_kafka.Message, tested without a broker (Message(...) builds one).
"""

import base64
import binascii
import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from inbox.errors import InvalidHeaders, InvalidPayload, MissingEventId, PoisonRecord

# Headers the outbox relay writes on every record.
EVENT_ID_HEADER = "event_id"
EVENT_TYPE_HEADER = "event_type"
AGGREGATE_TYPE_HEADER = "aggregate_type"
AGGREGATE_ID_HEADER = "aggregate_id"

# Column sizes of InboxMessage.
EVENT_ID_MAX_LENGTH = 255
NAME_MAX_LENGTH = 255

# Synthetic event ids of records without a usable event_id header live in this namespace,
# so the redelivery of one such record maps to the same id and is deduplicated too.
SYNTHETIC_EVENT_ID_NAMESPACE = uuid.UUID("6f1d7c52-35a4-4f4e-9d1b-0d6c1c1f2b7e")

# librdkafka's TIMESTAMP_NOT_AVAILABLE.
_TIMESTAMP_NOT_AVAILABLE = 0


@dataclass(slots=True)
class InboxRecord:
    """One record, decoded. `poison` is set when it cannot reach a handler."""

    event_id: str
    topic: str
    partition: int
    offset: int
    key: str | None
    event_type: str
    aggregate_type: str
    aggregate_id: str
    payload: Any
    # The record's value as it arrived, handed to PostgreSQL as jsonb without re-encoding.
    payload_json: str | None
    headers: dict[str, str]
    published_at: dt.datetime | None
    raw_value: str = ""
    raw_value_encoding: str = ""
    poison: PoisonRecord | None = None


def synthetic_event_id(*, topic: str, partition: int, offset: int) -> str:
    return str(uuid.uuid5(SYNTHETIC_EVENT_ID_NAMESPACE, f"{topic}/{partition}/{offset}"))


# PostgreSQL's text and jsonb cannot hold NUL, though UTF-8 can: text with one is not
# stored as it is, or the batch's INSERT fails on every redelivery.
_NUL = "\x00"
# A header value that is not storable text is kept as this prefix and its bytes in base64.
BASE64_PREFIX = "base64:"


def _decode_header(value: str | bytes | None) -> tuple[str, bool]:
    """The header's value as stored, and whether that is the value itself."""
    if value is None:
        return "", True
    raw = value.encode("utf-8", errors="surrogatepass") if isinstance(value, str) else value
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or _NUL in text:
        return BASE64_PREFIX + base64.b64encode(raw).decode("ascii"), False
    return text, True


def _decode_key(raw_key: bytes | str | None) -> str | None:
    if raw_key is None:
        return None
    if isinstance(raw_key, str):
        raw_key = raw_key.encode("utf-8", errors="surrogatepass")
    # Bytes that are not UTF-8, and NUL, are written \xNN: the record still reaches its
    # handler, whose key is then not the producer's bytes exactly.
    return raw_key.decode("utf-8", errors="backslashreplace").replace(_NUL, "\\x00")


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON, and PostgreSQL's jsonb refuses them.
    raise ValueError(f"{name} is not valid JSON")


def _raw(value: bytes) -> tuple[str, str]:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64"
    if _NUL in text:
        return base64.b64encode(value).decode("ascii"), "base64"
    return text, "utf-8"


def parse_record(message: Message) -> InboxRecord:
    topic = message.topic() or ""
    partition = message.partition() or 0
    offset = message.offset() or 0
    raw_headers = message.headers() or ()
    if isinstance(raw_headers, dict):
        raw_headers = list(raw_headers.items())
    # A repeated header name keeps its last value.
    headers: dict[str, str] = {}
    unreadable: set[str] = set()
    for name, value in raw_headers:
        name = name.replace(_NUL, "\\x00")
        headers[name], readable = _decode_header(value)
        if readable:
            unreadable.discard(name)
        else:
            unreadable.add(name)
    key = _decode_key(message.key())
    timestamp_type, timestamp_ms = message.timestamp()
    published_at = (
        None
        if timestamp_type == _TIMESTAMP_NOT_AVAILABLE
        else dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.UTC)
    )
    record = InboxRecord(
        event_id=headers.get(EVENT_ID_HEADER, ""),
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        event_type=headers.get(EVENT_TYPE_HEADER, "")[:NAME_MAX_LENGTH],
        aggregate_type=headers.get(AGGREGATE_TYPE_HEADER, "")[:NAME_MAX_LENGTH],
        aggregate_id=headers.get(AGGREGATE_ID_HEADER, "")[:NAME_MAX_LENGTH],
        payload=None,
        payload_json=None,
        headers=headers,
        published_at=published_at,
    )
    if not record.event_id:
        record.poison = MissingEventId(
            "The record has no event_id header; it is kept under a synthetic id derived from "
            "its topic, partition and offset. Check the producer: the outbox relay always "
            "sets event_id."
        )
    elif EVENT_ID_HEADER in unreadable or len(record.event_id) > EVENT_ID_MAX_LENGTH:
        record.poison = InvalidHeaders(
            "The event_id header is not UTF-8, holds a NUL byte, or is longer than "
            f"{EVENT_ID_MAX_LENGTH} characters; the record is kept under a synthetic id, and "
            "the header's bytes in base64 under headers."
        )
    if record.poison is not None:
        record.event_id = synthetic_event_id(topic=topic, partition=partition, offset=offset)
    elif EVENT_TYPE_HEADER in unreadable:
        # Which handler it was meant for cannot be told: failed, never ignored as unknown.
        record.poison = InvalidHeaders(
            "The event_type header is not UTF-8 or holds a NUL byte; its bytes are kept in "
            "base64 under headers. Fix the producer and publish the event again."
        )

    value = message.value()
    if value is None:
        record.poison = record.poison or InvalidPayload(
            "The record has no value (a tombstone?); the inbox expects a JSON payload."
        )
        return record
    try:
        text = value.decode("utf-8")
        payload = json.loads(text, parse_constant=_reject_constant)
        if "\\u0000" in text:
            raise ValueError("a \\u0000 escape, which PostgreSQL's jsonb cannot store")
    except (UnicodeDecodeError, ValueError, binascii.Error) as error:
        record.raw_value, record.raw_value_encoding = _raw(value)
        record.poison = record.poison or InvalidPayload(
            f"The record's value is not UTF-8 JSON ({error}); its bytes are kept in raw_value."
        )
        return record
    record.payload = payload
    record.payload_json = text
    return record


def poison_description(poison: PoisonRecord) -> str:
    return f"{poison.code}: {poison}"
