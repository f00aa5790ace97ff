"""Bulk operator actions: the rows a filter (or a list of ids) names are frozen at submit and
the action applied to them a chunk at a time, each chunk in its own transaction.

A set of one chunk runs in the request. A larger one becomes a BulkOperation whose chunks a
Celery task (console.tasks.run_bulk_operation) applies under CONSOLE_BULK_MAX_ROWS_PER_SECOND,
counting chunks and changed rows as it goes; a cancel takes effect between two chunks. A
running operation whose worker died is resumed by the beat task console.reap_bulk_operations
(bulk_operations_reap). Every bulk action needs a reason, kept in its audit entry.
"""

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from console.audit import operator_action_add_progress, operator_action_record
from console.models import BulkOperation, BulkOperationChunk, OperatorAction
from console.operations import (
    ACTIONS,
    BulkTooLarge,
    OperationFinished,
    ReasonRequired,
    model_label,
    require_permission,
)
from console.selectors import rows_counted_up_to
from outbox.services.event_log.shards import server_session_handed_on

Status = BulkOperation.Status
REASON_MAX_LENGTH = 2000
# The first key of the PostgreSQL advisory lock a run of an operation holds (the second is
# the operation's id): "BULK" in ASCII.
RUN_LOCK_NAMESPACE = 0x42554C4B


@contextmanager
def _run_lock(operation_id: int) -> Iterator[bool]:
    """Whether this process may run the operation: one run at a time, so that a second
    delivery of the task neither applies chunks out of order nor doubles the rate. The lock is
    the database session's: a worker that dies releases it with its connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [RUN_LOCK_NAMESPACE, operation_id])
        held = bool(cursor.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_unlock(%s, %s)", [RUN_LOCK_NAMESPACE, operation_id]
                )


def _no_run_holds(operation_id: int) -> bool:
    """No process runs the operation now (to be asked inside a transaction: the answer holds
    until it ends)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(%s, %s)", [RUN_LOCK_NAMESPACE, operation_id]
        )
        return bool(cursor.fetchone()[0])


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value


def _refuse_too_large(limit: int) -> NoReturn:
    raise BulkTooLarge(
        f"The selection has more than {limit} rows (CONSOLE_BULK_MAX_ROWS); narrow the "
        "filter, e.g. by date range, and run the action once per part."
    )


def bulk_reason_cleaned(reason: str | None) -> str:
    """The reason as stored; refuses a missing or blank one."""
    cleaned = (reason or "").strip()
    if not cleaned:
        raise ReasonRequired(
            "A bulk action needs a reason for the audit log: say why these rows are changed "
            "(e.g. 'broker quota raised, INC-1234')."
        )
    return cleaned[:REASON_MAX_LENGTH]


def bulk_action_count(queryset: QuerySet) -> int:
    """The rows a bulk action over `queryset` would touch (a dry run), refused as the action
    would be beyond CONSOLE_BULK_MAX_ROWS: counted no further than that."""
    limit = settings.CONSOLE_BULK_MAX_ROWS
    count = rows_counted_up_to(queryset, limit=limit)
    if count > limit:
        _refuse_too_large(limit)
    return count


def bulk_action_run(
    *,
    user: Any,
    action: str,
    source: str,
    reason: str,
    queryset: QuerySet | None = None,
    ids: Sequence[Any] | None = None,
    filters: dict[str, Any] | None = None,
) -> OperatorAction:
    """Runs `action` over the rows of `queryset` (or `ids`), frozen now; returns its audit
    entry.

    Up to CONSOLE_BULK_CHUNK_SIZE rows run here, and the entry's BulkOperation is DONE. A larger
    set is stored as chunks of ids and its BulkOperation (`entry.bulk_operation`) is QUEUED for
    the Celery task once this transaction commits.
    """
    spec = ACTIONS[action]
    require_permission(user, spec.permission)
    reason = bulk_reason_cleaned(reason)
    limit = settings.CONSOLE_BULK_MAX_ROWS
    with transaction.atomic():
        if queryset is not None:
            frozen = list(queryset.order_by().values_list("pk", flat=True)[: limit + 1])
        else:
            frozen = list(ids or [])
        if len(frozen) > limit:
            _refuse_too_large(limit)
        chunk_size = settings.CONSOLE_BULK_CHUNK_SIZE
        chunks = [
            [_jsonable(value) for value in frozen[start : start + chunk_size]]
            for start in range(0, len(frozen), chunk_size)
        ]
        record = operator_action_record(
            user=user,
            action=action,
            model=model_label(spec.model),
            source=source,
            requested=len(frozen),
            object_ids=[_jsonable(value) for value in frozen],
            filters=filters or {},
            reason=reason,
            chunks_pending=len(chunks) if len(chunks) > 1 else 0,
        )
        if len(chunks) <= 1:
            changed = spec.apply(frozen) if frozen else 0
            now = timezone.now()
            OperatorAction.objects.filter(pk=record.pk).update(changed=changed)
            record.changed = changed
            BulkOperation.objects.create(
                audit=record,
                status=Status.DONE,
                chunks_total=len(chunks),
                chunks_done=len(chunks),
                rows_done=len(frozen),
                rows_changed=changed,
                started_at=now,
                finished_at=now,
            )
            return record
        operation = BulkOperation.objects.create(audit=record, chunks_total=len(chunks))
        BulkOperationChunk.objects.bulk_create(
            BulkOperationChunk(operation=operation, index=index, object_ids=chunk)
            for index, chunk in enumerate(chunks)
        )

        transaction.on_commit(lambda: _enqueue_run(operation.pk))
    return record


def _apply_next_chunk(operation: BulkOperation) -> int | None:
    """Applies the operation's next chunk and deletes it, in one transaction; returns its
    number of rows, or None when no chunk is left for this worker."""
    spec = ACTIONS[operation.audit.action]
    with transaction.atomic():
        # skip_locked: a second delivery of the task never applies the chunk the first holds.
        chunk = (
            BulkOperationChunk.objects.select_for_update(skip_locked=True)
            .filter(operation=operation)
            .order_by("index")
            .first()
        )
        if chunk is None:
            return None
        changed = spec.apply(chunk.object_ids)
        rows = len(chunk.object_ids)
        chunk.delete()
        BulkOperation.objects.filter(pk=operation.pk).update(
            chunks_done=F("chunks_done") + 1,
            rows_done=F("rows_done") + rows,
            rows_changed=F("rows_changed") + changed,
        )
        operator_action_add_progress(action_id=operation.audit_id, changed=changed, chunks_done=1)
    return rows


def _finish(operation_id: int, status: str, error: str = "") -> None:
    with transaction.atomic():
        operation = BulkOperation.objects.select_for_update().get(pk=operation_id)
        if operation.is_finished:
            return
        if status == Status.DONE and operation.chunks.exists():
            return  # another delivery of the task still holds a chunk; it finishes
        operation.chunks.all().delete()
        operation.status = status
        operation.finished_at = timezone.now()
        operation.error = error
        operation.save(update_fields=["status", "finished_at", "error"])
        # Finished: no chunk is pending any more.
        OperatorAction.objects.filter(pk=operation.audit_id).update(chunks_pending=0)


def bulk_operation_run(
    *,
    operation_id: int,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> BulkOperation:
    """Applies a queued operation's chunks in order, one transaction each, pausing between
    chunks to stay under CONSOLE_BULK_MAX_ROWS_PER_SECOND, and stops before the next chunk
    once a cancel is requested. Safe to run again for the same operation: a redelivered task
    resumes at the first chunk not yet applied, and does nothing while another run holds the
    operation.

    An OperationalError (the database went away) propagates, for the task to retry; any other
    error marks the operation FAILED with its text, the chunks already applied staying applied.
    """
    shared_session = server_session_handed_on()
    if shared_session is not None:
        # The run's lock is its session's: through a pool in transaction mode it would stay
        # on a server session other clients get, and every later run would wait for it.
        _finish(
            operation_id,
            Status.FAILED,
            error=(
                "The bulk operation ran through a database pooler in transaction mode: two of "
                f"its connections got one server session (process {shared_session}), and a run "
                "holds a lock of its session. Give the Celery workers that run "
                "console.run_bulk_operation a DATABASES['default'] that reaches PostgreSQL "
                "directly or through a pool in session mode (in this project: their "
                "DATABASE_URL), then run the action again."
            ),
        )
    else:
        with _run_lock(operation_id) as held:
            if held:
                _run(operation_id, sleep=sleep, clock=clock)
    return BulkOperation.objects.select_related("audit").get(pk=operation_id)


def _run(operation_id: int, *, sleep: Callable[[float], None], clock: Callable[[], float]) -> None:
    claimed = BulkOperation.objects.filter(
        pk=operation_id, status__in=(Status.QUEUED, Status.RUNNING)
    ).update(status=Status.RUNNING)
    if claimed:
        BulkOperation.objects.filter(pk=operation_id, started_at__isnull=True).update(
            started_at=timezone.now()
        )
        rate = settings.CONSOLE_BULK_MAX_ROWS_PER_SECOND
        started = clock()
        rows_here = 0
        while True:
            operation = BulkOperation.objects.select_related("audit").get(pk=operation_id)
            if operation.cancel_requested_at is not None:
                _finish(operation_id, Status.CANCELLED)
                break
            try:
                rows = _apply_next_chunk(operation)
            except OperationalError:
                raise
            except Exception as error:
                _finish(operation_id, Status.FAILED, error=f"{type(error).__name__}: {error}")
                break
            if rows is None:
                _finish(operation_id, Status.DONE)
                break
            rows_here += rows
            if rate > 0:
                # Paced by the rows applied since this run started, so a slow chunk is not
                # followed by a longer pause than the cap asks for.
                pause = rows_here / rate - (clock() - started)
                if pause > 0:
                    sleep(pause)


def bulk_operation_cancel(
    *, user: Any, operation: BulkOperation, source: str, note: str = ""
) -> BulkOperation:
    """Cancels a bulk operation: a queued one at once, a running one before its next chunk
    (the chunks already applied stay applied), one whose run has died (no process holds it) at
    once. Needs the permission of the operation's own action; logged in the audit log. Refuses
    an operation that has finished."""
    spec = ACTIONS[operation.audit.action]
    require_permission(user, spec.permission)
    with transaction.atomic():
        operation = (
            BulkOperation.objects.select_for_update(of=("self",))
            .select_related("audit")
            .get(pk=operation.pk)
        )
        if operation.is_finished:
            raise OperationFinished(
                f"Bulk operation {operation.pk} is {operation.status}; there is nothing left "
                "to cancel."
            )
        username = getattr(user, "get_username", lambda: "")() or "anonymous"
        if operation.cancel_requested_at is None:
            operation.cancel_requested_at = timezone.now()
            operation.cancelled_by = username
            operation.save(update_fields=["cancel_requested_at", "cancelled_by"])
            operator_action_record(
                user=user,
                action=OperatorAction.Action.BULK_CANCEL,
                model=model_label(BulkOperation),
                source=source,
                requested=1,
                changed=1,
                object_ids=[operation.pk],
                filters={"operation": operation.pk, "audit": operation.audit_id},
                note=note,
            )
        if operation.status == Status.QUEUED or _no_run_holds(operation.pk):
            # Queued, no worker has claimed it (a claim waits for this row's lock); running,
            # its worker died or gave up: it ends now rather than when a worker gets to it, or
            # never if none is running.
            _finish(operation.pk, Status.CANCELLED)
    operation.refresh_from_db()
    return operation


def _enqueue_run(operation_id: int) -> None:
    from console.tasks import run_bulk_operation

    run_bulk_operation.delay(operation_id)


@dataclass(frozen=True)
class Reaped:
    """What bulk_operations_reap did, by operation id."""

    resumed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)


def bulk_operations_reap() -> Reaped:
    """Ends the wait of each RUNNING operation that no process runs any more (its worker died:
    the run's advisory lock went with its database session). Otherwise it would show RUNNING
    until the broker delivered its task again, if ever.

    Such an operation is resumed: QUEUED again and its task sent once this transaction
    commits, so a worker applies the chunks left, from the first not applied. That is sound
    because each chunk is frozen ids applied and deleted in one transaction: the chunks left are
    exactly the work not done, and a late redelivery of the old task does nothing while the
    new run holds the operation. After CONSOLE_BULK_MAX_RESUMES resumes it is FAILED instead,
    with the reason in its error (a chunk that kills its worker must not run for ever); one
    with a cancel requested is CANCELLED. An operation whose run is alive is left alone."""
    reaped = Reaped()
    running = BulkOperation.objects.filter(status=Status.RUNNING).order_by("pk")
    for operation_id in running.values_list("pk", flat=True):
        outcome = _reap(operation_id)
        if outcome is not None:
            getattr(reaped, outcome).append(operation_id)
    return reaped


def _reap(operation_id: int) -> str | None:
    """Resumes, fails or cancels one RUNNING operation that no run holds; returns which
    (a field of Reaped), or None for one left alone."""
    with transaction.atomic():
        # skip_locked: a chunk's transaction holds the row while its run is alive.
        operation = (
            BulkOperation.objects.select_for_update(skip_locked=True)
            .filter(pk=operation_id, status=Status.RUNNING)
            .first()
        )
        if operation is None or not _no_run_holds(operation_id):
            return None
        if operation.cancel_requested_at is not None:
            _finish(operation_id, Status.CANCELLED)
            return "cancelled"
        limit = settings.CONSOLE_BULK_MAX_RESUMES
        if operation.resumes >= limit:
            left = operation.chunks_total - operation.chunks_done
            _finish(
                operation_id,
                Status.FAILED,
                error=f"The worker running it died, after {operation.resumes} resumes "
                f"(CONSOLE_BULK_MAX_RESUMES is {limit}): it is not resumed again. The "
                f"{operation.chunks_done} chunks applied stay applied; the {left} left were "
                "not. Look for what stops the worker (its log, memory), then run the action "
                "again for the rows still to change.",
            )
            return "failed"
        BulkOperation.objects.filter(pk=operation_id).update(
            status=Status.QUEUED, resumes=F("resumes") + 1
        )
        transaction.on_commit(lambda: _enqueue_run(operation_id))
    return "resumed"


def bulk_action_apply_chunk(*, action_id: int, object_ids: Sequence[Any]) -> int:
    """Applies one chunk queued, ids and all, by a version before bulk operations existed (its
    task messages may still wait in the broker after an upgrade), and records the progress."""
    record = OperatorAction.objects.get(pk=action_id)
    spec = ACTIONS[record.action]
    with transaction.atomic():
        changed = spec.apply(object_ids)
        operator_action_add_progress(action_id=action_id, changed=changed, chunks_done=1)
    return changed
