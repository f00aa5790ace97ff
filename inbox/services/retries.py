"""Retries: a due PENDING row run again by its handler, from the retry task, and rows made
due now by an operator."""

from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from inbox import metrics
from inbox.conf import inbox_settings
from inbox.errors import NoHandlerForRetry
from inbox.models import InboxMessage
from inbox.registry import Handler, HandlerRegistry, get_registry
from inbox.services.attempts import Attempt, attempt_member, attempt_of, inbox_attempts_insert
from inbox.services.handler_runs import _run_handler, format_error
from inbox.services.recording import PENDING, _failure_state
from inbox.services.repairs import _replayable_failed
from inbox.tracing import Outcome, retry_span, running_in
from kafka_events.tracing import active_tracer

# Who runs the handlers of the retry task (inbox.tasks.retry_due), in its attempt rows.
RETRY_MEMBER = "retry-task"


def retry_member() -> str:
    return attempt_member(RETRY_MEMBER)


def handler_run_again(
    *, message: InboxMessage, registry: HandlerRegistry
) -> tuple[BaseException | None, float, Attempt]:
    """Runs the handler of a row from its stored payload, in a savepoint of the caller's
    transaction (which has the row locked), and sets the row's new state on `message`
    without saving it; returns the handler's error, its time and its attempt, which the
    caller writes (inbox_attempts_insert) in the transaction that saves the row."""
    entry = registry.get(group=message.consumer_group, event_type=message.event_type)
    error: BaseException | None
    if entry is None:
        error = NoHandlerForRetry(
            f"No handler for {message.event_type!r} in group {message.consumer_group!r} "
            "in this process; is its app installed and its handlers.py imported?"
        )
        seconds = 0.0
    else:
        error, seconds = _run_traced(entry, message)
    finished = timezone.now()
    message.attempts += 1
    error_text = "" if error is None else format_error(error)
    if error is None:
        message.status = InboxMessage.Status.DONE
        message.processed_at = finished
        message.next_attempt_at = None
        message.last_error = ""
    else:
        status, message.next_attempt_at = _failure_state(attempts=message.attempts, now=finished)
        message.status = InboxMessage.Status(status)
        message.last_error = error_text
    attempt = attempt_of(
        message_id=message.pk,
        finished=finished,
        seconds=seconds,
        error=error,
        error_text=error_text,
        partition=message.partition,
        offset=message.offset,
        handler="" if entry is None else entry.name,
    )
    return error, seconds, attempt


def _run_traced(entry: Handler, message: InboxMessage) -> tuple[BaseException | None, float]:
    """Runs the handler, inside a span of its own when tracing is on: a new span (the first
    run's trace ended long ago) linked to the event's creation context."""
    tracer = active_tracer()
    if tracer is None:
        return _run_handler(entry, message)
    with running_in(retry_span(tracer, message=message)) as end:
        error, seconds = _run_handler(entry, message)
        end.outcome = Outcome.PROCESSED if error is None else Outcome.FAILED
        end.error = error
    return error, seconds


def count_on_commit(*, message: InboxMessage, error: BaseException | None, seconds: float) -> None:
    """Counts a handler's run again in the metrics once the transaction commits."""
    group, published_at, processed_at = (
        message.consumer_group,
        message.published_at,
        message.processed_at,
    )

    def count() -> None:
        metrics.HANDLER_SECONDS.labels(group).observe(seconds)
        if error is None:
            metrics.PROCESSED.labels(group).inc()
            if published_at is not None and processed_at is not None:
                metrics.CONSUME_LAG_SECONDS.labels(group).observe(
                    (processed_at - published_at).total_seconds()
                )
        else:
            metrics.FAILED.labels(group, "handler").inc()

    transaction.on_commit(count)


def inbox_message_retry(
    *, message_id: int, registry: HandlerRegistry | None = None
) -> InboxMessage | None:
    """Runs the handler of one due PENDING row from its stored payload, in its own
    transaction. Returns None when the row is gone, not due, or locked by another worker."""
    registry = registry if registry is not None else get_registry()
    with transaction.atomic():
        message = (
            InboxMessage.objects.select_for_update(skip_locked=True)
            .filter(id=message_id, status=PENDING, next_attempt_at__lte=timezone.now())
            .first()
        )
        if message is None:
            return None
        error, seconds, attempt = handler_run_again(message=message, registry=registry)
        message.save(
            update_fields=["status", "attempts", "next_attempt_at", "last_error", "processed_at"]
        )
        inbox_attempts_insert(attempts=[attempt], member=retry_member())
        count_on_commit(message=message, error=error, seconds=seconds)
    return message


def inbox_messages_retry_due(
    *, limit: int | None = None, registry: HandlerRegistry | None = None
) -> dict[str, int]:
    """Retries up to `limit` due rows that run on their own, oldest due first, then runs up to
    `limit` sequences of ordered groups whose first row can run (a due head, then the rows
    parked behind it). Returns counts by outcome."""
    from inbox.selectors import inbox_message_ids_due_for_retry
    from inbox.services.sequences import inbox_sequence_run, runnable_sequences

    limit = limit or inbox_settings.RETRY_BATCH_SIZE
    counts = {"done": 0, "pending": 0, "failed": 0, "skipped": 0}
    for message_id in inbox_message_ids_due_for_retry(limit=limit):
        message = inbox_message_retry(message_id=message_id, registry=registry)
        if message is None:
            counts["skipped"] += 1
        else:
            counts[message.status.lower()] += 1
    for group, topic, key in runnable_sequences(limit=limit):
        run = inbox_sequence_run(group=group, topic=topic, key=key, registry=registry)
        for outcome in run.outcomes:
            counts[outcome.lower()] += 1
    return counts


def inbox_messages_retry(*, message_ids: Sequence[int]) -> int:
    """Makes rows run again now: a PENDING row waiting for its backoff becomes due, a FAILED
    row is replayed (fresh retry budget). DONE rows, and FAILED rows an operator discarded
    (replay those on purpose), are left alone. Returns how many changed."""
    if not message_ids:
        return 0
    with transaction.atomic():
        made_due = InboxMessage.objects.filter(
            pk__in=list(message_ids), status=PENDING, next_attempt_at__gt=timezone.now()
        ).update(next_attempt_at=timezone.now())
        replayed = (
            _replayable_failed(message_ids)
            .filter(discarded_at__isnull=True)
            .update(status=PENDING, attempts=0, next_attempt_at=timezone.now())
        )
    return made_due + replayed
