"""Writes of the console's audit log: one entry per operator action, and the progress of an
action that runs in queued chunks."""

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Greatest

from console.models import OperatorAction


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
    reason: str = "",
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
        reason=reason,
        chunks_pending=chunks_pending,
    )


def operator_action_add_progress(*, action_id: int, changed: int, chunks_done: int = 0) -> None:
    """Adds the rows a chunk of a queued action changed, and counts the chunk as done."""
    OperatorAction.objects.filter(pk=action_id).update(
        changed=F("changed") + changed,
        chunks_pending=Greatest(F("chunks_pending") - chunks_done, Value(0)),
    )
