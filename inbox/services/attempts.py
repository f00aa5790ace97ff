"""Attempt history: one row per run of a message's handler (inbox.models.InboxAttempt),
written in the transaction that records the run's outcome, one statement per batch."""

import datetime as dt
import os
import socket
from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import connection

from inbox.models import InboxAttempt
from inbox.services.handler_runs import error_class

DONE = InboxAttempt.Outcome.DONE.value
FAILED = InboxAttempt.Outcome.FAILED.value
# Whatever member text a client reports, the column keeps its first 255 characters.
MEMBER_MAX_CHARS = 255

# One run: message id, attempted_at, duration_ms, outcome, error_class, error, partition,
# offset, handler. A tuple: the consumer makes one per message of a batch.
Attempt = tuple[int, dt.datetime, float, str, str, str, int, int, str]

_INSERT_SQL = """
INSERT INTO inbox_attempt (
    message_id, attempted_at, duration_ms, outcome, error_class, error, member, "partition",
    "offset", handler
)
SELECT a.message_id, a.attempted_at, a.duration_ms, a.outcome, a.error_class, a.error,
    %(member)s, a.partition, a.offset, a.handler
FROM unnest(
    %(message_id)b::bigint[], %(attempted_at)b::timestamptz[], %(duration_ms)b::float8[],
    %(outcome)b::text[], %(error_class)b::text[], %(error)b::text[], %(partition)b::integer[],
    %(offset)b::bigint[], %(handler)b::text[]
) AS a(
    message_id, attempted_at, duration_ms, outcome, error_class, error, partition, "offset",
    handler
)
"""
_COLUMNS = (
    "message_id",
    "attempted_at",
    "duration_ms",
    "outcome",
    "error_class",
    "error",
    "partition",
    "offset",
    "handler",
)


def attempt_member(name: str) -> str:
    """Who ran an attempt: `name` (a consumer's group member id or client.id, or the retry
    task) at this host and process. Called once per batch, read afresh: a forked worker has
    a pid of its own."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}"[:MEMBER_MAX_CHARS]


def attempt_of(
    *,
    message_id: int,
    finished: dt.datetime,
    seconds: float,
    error: BaseException | None,
    error_text: str,
    partition: int,
    offset: int,
    handler: str,
) -> Attempt:
    """The attempt of a handler that ran for `seconds` until `finished`; `error_text` is its
    error as last_error keeps it (handler_runs.format_error)."""
    return (
        message_id,
        finished - dt.timedelta(seconds=seconds),
        seconds * 1000,
        DONE if error is None else FAILED,
        "" if error is None else error_class(error),
        error_text,
        partition,
        offset,
        handler,
    )


def inbox_attempts_insert(*, attempts: Sequence[Attempt], member: str) -> None:
    """Writes the attempts, all run by `member`, in one statement. Call in the transaction
    that records their outcomes on the messages."""
    if not attempts:
        return
    params: dict[str, Any] = dict(
        zip(_COLUMNS, (list(c) for c in zip(*attempts, strict=True)), strict=True)
    )
    params["member"] = member
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(_INSERT_SQL, params)
