"""inbox/records.py: decoding records, without a broker."""

import datetime as dt

from confluent_kafka import Message

from inbox.records import parse_record, synthetic_event_id
from tests.inbox.factories import Event


def message(*, value, headers, key=b"42", offset=7, timestamp=(1, 1_700_000_000_000)):
    return Message(
        topic="orders",
        partition=3,
        offset=offset,
        key=key,
        value=value,
        headers=headers,
        timestamp=timestamp,
    )


def test_a_relay_record_is_decoded():
    event = Event(extra_headers={"traceparent": "00-abc-def-01"})
    record = parse_record(event.message(topic="orders", partition=2, offset=9))
    assert record.poison is None
    assert record.event_id == event.event_id
    assert (record.topic, record.partition, record.offset) == ("orders", 2, 9)
    assert record.event_type == "OrderPlaced"
    assert (record.aggregate_type, record.aggregate_id) == ("order", event.aggregate_id)
    assert record.key == event.aggregate_id
    assert record.payload == event.payload
    assert record.payload_json == '{"amount": 10}'
    assert record.headers["traceparent"] == "00-abc-def-01"
    assert record.headers["content-type"] == "application/json"
    assert record.published_at is not None


def test_published_at_is_the_record_timestamp():
    record = parse_record(message(value=b"{}", headers=[("event_id", b"e1")]))
    assert record.published_at == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
    assert parse_record(message(value=b"{}", headers=[], timestamp=(0, -1))).published_at is None


def test_a_record_without_event_id_gets_a_deterministic_synthetic_id():
    first = parse_record(message(value=b"{}", headers=[("event_type", b"X")]))
    again = parse_record(message(value=b"{}", headers=[("event_type", b"X")]))
    other = parse_record(message(value=b"{}", headers=[], offset=8))
    assert first.poison is not None
    assert first.poison.code == "missing_event_id"
    assert (
        first.event_id
        == again.event_id
        == synthetic_event_id(topic="orders", partition=3, offset=7)
    )
    assert other.event_id != first.event_id


def test_a_value_that_is_not_json_is_kept_as_text():
    record = parse_record(message(value=b"hello", headers=[("event_id", b"e1")]))
    assert record.poison is not None
    assert record.poison.code == "invalid_payload"
    assert (record.raw_value, record.raw_value_encoding) == ("hello", "utf-8")
    assert record.payload is None
    assert record.event_id == "e1"


def test_a_value_that_is_not_utf8_is_kept_as_base64():
    record = parse_record(message(value=b"\xff\x00", headers=[("event_id", b"e1")]))
    assert record.poison is not None
    assert (record.raw_value, record.raw_value_encoding) == ("/wA=", "base64")


def test_json_postgresql_cannot_store_is_poison():
    for value in (b'{"a": "\\u0000"}', b'{"a": NaN}'):
        record = parse_record(message(value=value, headers=[("event_id", b"e1")]))
        assert record.poison is not None, value
        assert record.raw_value_encoding == "utf-8"


def test_a_tombstone_is_poison():
    record = parse_record(message(value=None, headers=[("event_id", b"e1")]))
    assert record.poison is not None
    assert record.poison.code == "invalid_payload"


def test_an_unusable_event_id_is_replaced():
    too_long = parse_record(message(value=b"{}", headers=[("event_id", b"x" * 300)]))
    not_utf8 = parse_record(message(value=b"{}", headers=[("event_id", b"\xff")]))
    for record in (too_long, not_utf8):
        assert record.poison is not None
        assert record.poison.code == "invalid_headers"
        assert record.event_id == synthetic_event_id(topic="orders", partition=3, offset=7)


def test_keys_and_headers_that_are_not_utf8_survive():
    record = parse_record(
        message(value=b"{}", headers=[("event_id", b"e1"), ("blob", b"\xff")], key=b"\xfe")
    )
    assert record.key == "\\xfe"
    assert record.headers["blob"] == "base64:/w=="
    assert parse_record(message(value=b"{}", headers=[("event_id", b"e1")], key=None)).key is None


def test_nul_bytes_postgresql_cannot_store_are_escaped_or_kept_base64():
    record = parse_record(
        message(value=b"{}", headers=[("event_id", b"e1"), ("note", b"a\x00b")], key=b"k\x00")
    )
    assert record.poison is None
    assert record.key == "k\\x00"
    assert record.headers["note"] == "base64:YQBi"


def test_an_event_id_or_event_type_with_a_nul_byte_is_poison():
    bad_id = parse_record(message(value=b"{}", headers=[("event_id", b"e\x001")]))
    assert bad_id.poison is not None
    assert bad_id.poison.code == "invalid_headers"
    assert bad_id.event_id == synthetic_event_id(topic="orders", partition=3, offset=7)
    assert bad_id.headers["event_id"] == "base64:ZQAx"

    for event_type in (b"Order\x00Placed", b"\xff"):
        bad_type = parse_record(
            message(value=b"{}", headers=[("event_id", b"e1"), ("event_type", event_type)])
        )
        assert bad_type.poison is not None
        assert bad_type.poison.code == "invalid_headers"
        assert bad_type.event_id == "e1"
        assert bad_type.payload == {}


def test_a_header_that_only_looks_base64_is_read_as_it_is():
    record = parse_record(message(value=b"{}", headers=[("event_id", b"base64:e1")]))
    assert record.poison is None
    assert record.event_id == "base64:e1"
