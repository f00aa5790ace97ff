"""Operator actions, shared by the admin and the API: each checks its permission, calls the
app's services, and writes the audit log. Actions over many rows are in console.bulk_operations."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Model

from analytics.models import AnalyticsRun, AnalyticsRunPermission
from analytics.services import analytics_run_queue
from console.audit import operator_action_record
from console.models import OperatorAction
from inbox.errors import InvalidTransition
from inbox.models import InboxMessage, InboxMessagePermission
from inbox.services.repairs import (
    inbox_message_discard,
    inbox_message_replay,
    inbox_messages_discard,
    inbox_messages_replay,
)
from inbox.services.retries import inbox_messages_retry
from inbox.services.sequences import (
    inbox_sequence_release,
    inbox_sequence_retry,
    inbox_sequence_skip_head,
)
from outbox.models import OutboxEvent, OutboxEventPermission
from outbox.services.repairs import (
    outbox_event_discard,
    outbox_event_replay,
    outbox_event_retry,
    outbox_events_discard,
    outbox_events_replay,
    outbox_events_retry,
    outbox_key_release,
)

Action = OperatorAction.Action


class ConsoleError(Exception):
    code = "console_error"


class BulkTooLarge(ConsoleError):
    code = "bulk_too_large"


class NotPermitted(ConsoleError):
    code = "permission_denied"


class ReasonRequired(ConsoleError):
    code = "reason_required"


class OperationFinished(ConsoleError):
    code = "operation_finished"


@dataclass(frozen=True)
class ActionSpec:
    model: type[Model]
    permission: str
    # Applies the action to a chunk of ids; returns how many rows changed.
    apply: Callable[[Sequence[Any]], int]


ACTIONS: dict[str, ActionSpec] = {
    Action.OUTBOX_RETRY: ActionSpec(
        OutboxEvent,
        OutboxEventPermission.RETRY,
        lambda ids: outbox_events_retry(event_ids=ids),
    ),
    Action.OUTBOX_DISCARD: ActionSpec(
        OutboxEvent,
        OutboxEventPermission.DISCARD,
        lambda ids: outbox_events_discard(event_ids=ids),
    ),
    Action.OUTBOX_REPLAY: ActionSpec(
        OutboxEvent,
        OutboxEventPermission.REPLAY,
        lambda ids: outbox_events_replay(event_ids=ids, new_event_id=False),
    ),
    Action.OUTBOX_REPLAY_NEW_ID: ActionSpec(
        OutboxEvent,
        OutboxEventPermission.REPLAY,
        lambda ids: outbox_events_replay(event_ids=ids, new_event_id=True),
    ),
    Action.INBOX_RETRY: ActionSpec(
        InboxMessage,
        InboxMessagePermission.RETRY,
        lambda ids: inbox_messages_retry(message_ids=ids),
    ),
    Action.INBOX_REPLAY: ActionSpec(
        InboxMessage,
        InboxMessagePermission.REPLAY,
        lambda ids: inbox_messages_replay(message_ids=ids),
    ),
    Action.INBOX_DISCARD: ActionSpec(
        InboxMessage,
        InboxMessagePermission.DISCARD,
        lambda ids: inbox_messages_discard(message_ids=ids),
    ),
}


def model_label(model: type[Model]) -> str:
    return model._meta.label


def require_permission(user: Any, permission: str) -> None:
    if not user.has_perm(permission):
        # str(): a permission is often a TextChoices member, whose repr is not its name.
        raise NotPermitted(f"This action needs the permission {str(permission)!r}.")


# --- single rows -------------------------------------------------------------------------------


def outbox_event_action(
    *,
    user: Any,
    event: OutboxEvent,
    action: str,
    source: str,
    note: str = "",
) -> OutboxEvent:
    """Retries, discards or replays one event through its service, and logs it. Returns the
    event as it now is (for a replay with a new event id: the new event)."""
    spec = ACTIONS[action]
    require_permission(user, spec.permission)
    with transaction.atomic():
        if action == Action.OUTBOX_RETRY:
            result = outbox_event_retry(event=event)
        elif action == Action.OUTBOX_DISCARD:
            result = outbox_event_discard(event=event)
        elif action in (Action.OUTBOX_REPLAY, Action.OUTBOX_REPLAY_NEW_ID):
            result = outbox_event_replay(
                event=event, new_event_id=action == Action.OUTBOX_REPLAY_NEW_ID
            )
        else:
            raise ValueError(f"{action} is not an action on one outbox event")
        operator_action_record(
            user=user,
            action=action,
            model=model_label(OutboxEvent),
            source=source,
            requested=1,
            changed=1,
            object_ids=[str(event.pk)] + ([str(result.pk)] if result.pk != event.pk else []),
            note=note,
        )
    return result


def inbox_message_action(
    *, user: Any, message: InboxMessage, action: str, source: str, note: str = ""
) -> InboxMessage:
    """Retries, replays or discards one inbox message, and logs it."""
    spec = ACTIONS[action]
    require_permission(user, spec.permission)
    with transaction.atomic():
        if action == Action.INBOX_REPLAY:
            message = inbox_message_replay(message=message)
            changed = 1
        elif action == Action.INBOX_RETRY:
            changed = inbox_messages_retry(message_ids=[message.pk])
            if not changed:
                if message.discarded_at is not None:
                    raise InvalidTransition(
                        f"Message {message.pk} was discarded; replay it to run it again."
                    )
                raise InvalidTransition(
                    f"Message {message.pk} is {message.status}: only FAILED messages and "
                    "PENDING ones waiting for a retry can be retried."
                )
            message.refresh_from_db()
        elif action == Action.INBOX_DISCARD:
            message = inbox_message_discard(message=message)
            changed = 1
        else:
            raise ValueError(f"{action} is not an action on one inbox message")
        operator_action_record(
            user=user,
            action=action,
            model=model_label(InboxMessage),
            source=source,
            requested=1,
            changed=changed,
            object_ids=[message.pk],
            note=note,
        )
    return message


def outbox_key_release_action(
    *, user: Any, topic: str, key: str, source: str, note: str = ""
) -> OperatorAction:
    """Releases a quarantined key and logs it; the entry's `changed` counts the events."""
    require_permission(user, OutboxEventPermission.RELEASE_KEY)
    with transaction.atomic():
        changed = outbox_key_release(topic=topic, key=key)
        return operator_action_record(
            user=user,
            action=Action.OUTBOX_KEY_RELEASE,
            model=model_label(OutboxEvent),
            source=source,
            requested=1,
            changed=changed,
            filters={"topic": topic, "key": key},
            note=note,
        )


# The actions on a held key of the inbox (order per key), each with its permission.
INBOX_KEY_ACTIONS: dict[str, tuple[str, Callable[..., InboxMessage]]] = {
    Action.INBOX_SEQUENCE_RETRY: (InboxMessagePermission.RETRY_SEQUENCE, inbox_sequence_retry),
    Action.INBOX_SKIP_HEAD: (InboxMessagePermission.SKIP_HEAD, inbox_sequence_skip_head),
    Action.INBOX_KEY_RELEASE: (InboxMessagePermission.RELEASE_KEY, inbox_sequence_release),
}


def inbox_key_action(
    *,
    user: Any,
    action: str,
    consumer_group: str,
    topic: str,
    key: str,
    source: str,
    note: str = "",
) -> tuple[OperatorAction, InboxMessage]:
    """Retries the sequence of a held key, skips its head or releases it, and logs it; returns
    the audit entry and the head. The rows behind the head are run by the retry task."""
    permission, service = INBOX_KEY_ACTIONS[action]
    require_permission(user, permission)
    with transaction.atomic():
        head = service(group=consumer_group, topic=topic, key=key)
        record = operator_action_record(
            user=user,
            action=action,
            model=model_label(InboxMessage),
            source=source,
            requested=1,
            changed=1,
            object_ids=[head.pk],
            filters={"consumer_group": consumer_group, "topic": topic, "key": key},
            note=note,
        )
    return record, head


@dataclass(frozen=True)
class RunRequest:
    since: datetime
    until: datetime
    audit_id: int


def analytics_run_action(
    *,
    user: Any,
    source: str,
    since: datetime | None = None,
    until: datetime | None = None,
    note: str = "",
) -> RunRequest:
    """An operator asks for an analytics run (admin button, API): checks the permission,
    queues the job once the transaction commits and logs it. Without a window, the last one
    the SLA has closed (the beat's window)."""
    require_permission(user, AnalyticsRunPermission.RUN)
    with transaction.atomic():
        since, until = analytics_run_queue(
            since=since,
            until=until,
            trigger=AnalyticsRun.Trigger.API if source == "api" else AnalyticsRun.Trigger.ADMIN,
        )
        record = operator_action_record(
            user=user,
            action=Action.ANALYTICS_RUN,
            model=model_label(AnalyticsRun),
            source=source,
            requested=1,
            filters={"since": since.isoformat(), "until": until.isoformat()},
            note=note,
        )
    return RunRequest(since=since, until=until, audit_id=record.pk)
