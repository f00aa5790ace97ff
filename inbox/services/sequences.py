"""Order per key: in a group whose ordering is "key", the unfinished rows of one (topic, key)
form a sequence. Its first row is the head: a row whose handler failed (PENDING until its
next attempt, FAILED after the last) or was deferred. The rows behind it are PARKED,
recorded without running their handlers, and run after it, in offset order, once it is done
(inbox_sequence_run), or once an operator skips it (discards it) or releases it (it stays as
it is and no longer holds its key)."""

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from inbox.conf import inbox_settings
from inbox.errors import ImproperlyConfiguredInbox, InvalidTransition
from inbox.models import HOLDING, InboxMessage
from inbox.registry import HandlerRegistry, get_registry

ORDERINGS = ("key", "none")

PENDING = InboxMessage.Status.PENDING.value
PARKED = InboxMessage.Status.PARKED.value
FAILED = InboxMessage.Status.FAILED.value
DONE = InboxMessage.Status.DONE.value

# inbox.models.HOLDING in SQL, for the held-key probe.
HOLDING_SQL = (
    "status <> 'DONE' AND discarded_at IS NULL AND released_at IS NULL AND key IS NOT NULL"
)


def group_ordering(group: str) -> str:
    """The group's ordering, key or none: its INBOX["GROUP_ORDERING"] entry, else
    INBOX["ORDERING"]."""
    ordering = inbox_settings.GROUP_ORDERING.get(group, inbox_settings.ORDERING)
    if ordering not in ORDERINGS:
        raise ImproperlyConfiguredInbox(
            f"The ordering of group {group!r} is {ordering!r}; use 'key' or 'none'."
        )
    return ordering


def ordered_groups_q() -> Q:
    """The groups whose ordering is "key", as a condition on InboxMessage.consumer_group:
    those INBOX["GROUP_ORDERING"] names with "key", or all but those it names with "none"."""
    overrides = inbox_settings.GROUP_ORDERING
    if inbox_settings.ORDERING == "key":
        return ~Q(consumer_group__in=[g for g, ordering in overrides.items() if ordering != "key"])
    return Q(consumer_group__in=[g for g, ordering in overrides.items() if ordering == "key"])


def sequence_lock_name(group: str, topic: str, key: str) -> str:
    """The text whose hash is the advisory lock of a sequence (JSON: no separator to escape)."""
    return json.dumps([group, topic, key])


def _lock_sequences(group: str, sequences: Iterable[tuple[str, str]]) -> None:
    """Takes the transaction-level advisory lock of each sequence, in one order for every
    caller (no deadlock between two of them): one run of a sequence, or one operator's change
    of its head, at a time."""
    names = sorted(sequence_lock_name(group, topic, key) for topic, key in sequences)
    if not names:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(name, 0))"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS n(name, number) ORDER BY number",
            [names],
        )


def held_sequences(group: str, sequences: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of these (topic, key) sequences of the group have a row that holds the key.

    Read without a lock. A key found free is free for the batch: only a failure recorded by
    the consumer that owns the key's partition makes a key held. A key found held may be
    released meanwhile by a run of its sequence that has not committed yet: the message the
    batch parks then commits after the run's last read, and is the first holding row of its
    key, PARKED, which the retry task's next pass runs (runnable_sequences): late by a pass,
    never out of order, never stuck."""
    wanted = sorted(set(sequences))
    if not wanted:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            # One probe of the holding index per key, however many rows it holds: LIMIT
            # keeps it a probe whatever the statistics (a semi-join would scan the group's
            # holding rows, thousands when many keys are held, for every batch).
            f"""
            SELECT s.topic, s.key
            FROM unnest(%s::text[], %s::text[]) AS s(topic, key)
            JOIN LATERAL (
                SELECT 1 FROM inbox_message AS m
                WHERE m.consumer_group = %s AND m.topic = s.topic AND m.key = s.key
                  AND {HOLDING_SQL}
                LIMIT 1
            ) AS holding ON true
            """,  # noqa: S608 (HOLDING_SQL is a constant)
            [[topic for topic, _ in wanted], [key for _, key in wanted], group],
        )
        return {(topic, key) for topic, key in cursor.fetchall()}


def _sequence(group: str, topic: str, key: str) -> QuerySet[InboxMessage]:
    return InboxMessage.objects.filter(
        HOLDING, consumer_group=group, topic=topic, key=key
    ).order_by("partition", "offset")


@dataclass
class SequenceRun:
    done: int = 0
    # The row the run stopped at (its handler failed, or it waits for its next attempt or
    # for an operator), or None when the sequence ran to its end.
    stopped_at: InboxMessage | None = None
    outcomes: list[str] = field(default_factory=list)


def inbox_sequence_run(
    *,
    group: str,
    topic: str,
    key: str,
    registry: HandlerRegistry | None = None,
    chunk: int | None = None,
) -> SequenceRun:
    """Runs a key's rows in order from its head: a PENDING head that is due, then the PARKED
    rows behind it, each in a savepoint of its own as the retry task runs a row, stopping at
    the first that fails (it becomes the head: PENDING until its next attempt, or FAILED) or
    at a head that is not due or FAILED. Commits every `chunk` rows
    (INBOX["RETRY_BATCH_SIZE"]): a run cut short leaves a PARKED row first, which the retry
    task's next pass runs on."""
    from inbox.services.attempts import Attempt, inbox_attempts_insert
    from inbox.services.recording import states_update
    from inbox.services.retries import count_on_commit, handler_run_again, retry_member

    registry = registry if registry is not None else get_registry()
    chunk = chunk or inbox_settings.RETRY_BATCH_SIZE
    run = SequenceRun()
    while True:
        with transaction.atomic():
            _lock_sequences(group, [(topic, key)])
            rows = list(_sequence(group, topic, key).select_for_update()[:chunk])
            now = timezone.now()
            ran: list[InboxMessage] = []
            attempts: list[Attempt] = []
            for row in rows:
                waits = row.status == PENDING and (row.next_attempt_at or now) > now
                if row.status == FAILED or waits:
                    run.stopped_at = row
                    break
                error, seconds, attempt = handler_run_again(message=row, registry=registry)
                count_on_commit(message=row, error=error, seconds=seconds)
                ran.append(row)
                attempts.append(attempt)
                run.outcomes.append(str(row.status))
                if error is not None:
                    run.stopped_at = row
                    break
                run.done += 1
            # The chunk's new states in one statement.
            if ran:
                states_update(
                    [
                        (
                            r.pk,
                            r.status,
                            r.attempts,
                            r.next_attempt_at,
                            r.last_error,
                            r.processed_at,
                        )
                        for r in ran
                    ]
                )
                inbox_attempts_insert(attempts=attempts, member=retry_member())
        if run.stopped_at is not None or len(rows) < chunk:
            return run


def _head(group: str, topic: str, key: str) -> InboxMessage:
    if group_ordering(group) != "key":
        raise InvalidTransition(
            f"Group {group!r} has ordering 'none': its keys are never held "
            '(INBOX["ORDERING"], INBOX["GROUP_ORDERING"]).'
        )
    head = _sequence(group, topic, key).select_for_update().first()
    if head is None or head.status == PARKED:
        raise InvalidTransition(
            f"The key {key!r} of topic {topic!r} is not held in group {group!r}."
        )
    return head


def inbox_sequence_skip_head(*, group: str, topic: str, key: str) -> InboxMessage:
    """An operator's decision: the head will not run (it is discarded, FAILED, and stays for
    audit and dedup); the rows behind it run on, from the next."""
    with transaction.atomic():
        _lock_sequences(group, [(topic, key)])
        head = _head(group, topic, key)
        head.status = InboxMessage.Status.FAILED
        head.next_attempt_at = None
        head.discarded_at = timezone.now()
        head.save(update_fields=["status", "next_attempt_at", "discarded_at"])
    return head


def inbox_sequence_release(*, group: str, topic: str, key: str) -> InboxMessage:
    """An operator's decision: the head keeps its state (a FAILED head can be replayed later,
    then out of order) and no longer holds its key; the rows behind it run on."""
    with transaction.atomic():
        _lock_sequences(group, [(topic, key)])
        head = _head(group, topic, key)
        head.released_at = timezone.now()
        head.save(update_fields=["released_at"])
    return head


def inbox_sequence_retry(*, group: str, topic: str, key: str) -> InboxMessage:
    """An operator's decision: the head is due now (a FAILED one with a fresh retry budget);
    the retry task runs it, then the rows behind it, until one fails."""
    with transaction.atomic():
        _lock_sequences(group, [(topic, key)])
        head = _head(group, topic, key)
        if head.status == FAILED:
            head.attempts = 0
        head.status = InboxMessage.Status.PENDING
        head.next_attempt_at = timezone.now()
        head.save(update_fields=["status", "attempts", "next_attempt_at"])
    return head


def runnable_sequences(*, limit: int) -> list[tuple[str, str, str]]:
    """(group, topic, key) of the sequences of ordered groups whose first holding row can run
    now: a PARKED row (a run cut short, a head skipped or released) or a due PENDING one."""
    first_rows = (
        InboxMessage.objects.filter(HOLDING & ordered_groups_q())
        .order_by("consumer_group", "topic", "key", "partition", "offset")
        .distinct("consumer_group", "topic", "key")
        .values("id")
    )
    runnable = (
        InboxMessage.objects.filter(id__in=first_rows)
        .filter(Q(status=PARKED) | Q(status=PENDING, next_attempt_at__lte=timezone.now()))
        .order_by(F("next_attempt_at").asc(nulls_first=True))
        .values_list("consumer_group", "topic", "key")[:limit]
    )
    # HOLDING rows have a key.
    return [(group, topic, key or "") for group, topic, key in runnable]
