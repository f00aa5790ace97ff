"""An operator's repairs of FAILED rows: replay (run again, fresh retry budget) or discard,
one row or many."""

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from inbox.errors import InvalidTransition
from inbox.models import InboxMessage
from inbox.services.recording import FAILED, PENDING


def inbox_message_replay(*, message: InboxMessage) -> InboxMessage:
    """An operator's decision: run a FAILED row's handler again, with a fresh retry budget."""
    with transaction.atomic():
        message = InboxMessage.objects.select_for_update().get(pk=message.pk)
        if message.status != InboxMessage.Status.FAILED:
            raise InvalidTransition(
                f"Only FAILED messages can be replayed; this one is {message.status}."
            )
        if message.payload is None and message.raw_value_encoding:
            raise InvalidTransition(
                "This message's value is not JSON; no handler can run it. Fix the producer "
                "and publish the event again."
            )
        message.status = InboxMessage.Status.PENDING
        message.attempts = 0
        message.next_attempt_at = timezone.now()
        message.discarded_at = None
        message.save(update_fields=["status", "attempts", "next_attempt_at", "discarded_at"])
    return message


def inbox_message_discard(*, message: InboxMessage) -> InboxMessage:
    """An operator's decision: a FAILED row will not be run again. It stays, for audit and
    for the dedup of redeliveries, marked with the time it was discarded."""
    changed = InboxMessage.objects.filter(
        pk=message.pk, status=FAILED, discarded_at__isnull=True
    ).update(discarded_at=timezone.now())
    if not changed:
        current = InboxMessage.objects.filter(pk=message.pk).only("status").first()
        if current is not None and current.status == FAILED:
            raise InvalidTransition(f"Message {message.pk} is already discarded.")
        status = current.status if current is not None else "gone"
        raise InvalidTransition(f"Only FAILED messages can be discarded; this one is {status}.")
    message.refresh_from_db(fields=["discarded_at"])
    return message


# --- the console: bulk repairs -------------------------------------------------------------------


def _replayable_failed(message_ids: Sequence[int]) -> Any:
    # A value that is not JSON can never be handled (see inbox_message_replay).
    return InboxMessage.objects.filter(pk__in=list(message_ids), status=FAILED).exclude(
        payload__isnull=True, raw_value_encoding__gt=""
    )


def inbox_messages_replay(*, message_ids: Sequence[int]) -> int:
    """inbox_message_replay() for many rows: FAILED rows whose value is JSON, discarded or
    not, get a fresh retry budget and are due now. Returns how many changed."""
    if not message_ids:
        return 0
    return _replayable_failed(message_ids).update(
        status=PENDING, attempts=0, next_attempt_at=timezone.now(), discarded_at=None
    )


def inbox_messages_discard(*, message_ids: Sequence[int]) -> int:
    """inbox_message_discard() for many rows: FAILED rows not yet discarded are marked so.
    Returns how many changed."""
    if not message_ids:
        return 0
    return InboxMessage.objects.filter(
        pk__in=list(message_ids), status=FAILED, discarded_at__isnull=True
    ).update(discarded_at=timezone.now())
