"""The operators' repairs: retry, discard, replay, release a quarantined key, singly and in
bulk. Each refuses an illegal transition with IllegalTransition; the console checks the
permission and records who did what.

The event row is never changed: a repair acts on the held set and appends delivery records
(outbox.services.event_log.held)."""

import uuid
from collections.abc import Sequence

from django.db import transaction
from django.db.models import Q

from outbox.errors import (
    IllegalTransition,
)
from outbox.models import OutboxEvent, OutboxHeldEvent
from outbox.selectors import outbox_event_delivered, outbox_events_with_delivery
from outbox.services.event_log.held import (
    held_event_replay,
    held_events_discard,
    held_events_retry,
    held_key_release,
)
from outbox.services.nudge import relays_wake_on_commit
from outbox.services.publish import outbox_event_publish

REPLAY_OF_HEADER = "replay_of"


def outbox_event_retry(*, event: OutboxEvent) -> OutboxEvent:
    """Sends a FAILED event (or a held one waiting for its backoff) again, now, with a fresh
    set of attempts."""
    if held_events_retry(event_ids=[event.id]):
        relays_wake_on_commit()
        return outbox_event_delivered(event_id=event.id)
    current = outbox_event_delivered(event_id=event.id)
    if current.delivery_status == OutboxEvent.Status.DONE:
        raise IllegalTransition(
            f"Event {event.id} is already published; replay it instead of retrying it."
        )
    if current.delivery_discarded_at is not None:
        raise IllegalTransition(f"Event {event.id} was discarded; replay it to send it again.")
    held = OutboxHeldEvent.objects.filter(event_id=event.id).first()
    if held is None:
        raise IllegalTransition(f"Event {event.id} has not failed: the relay sends it in its turn.")
    head = (
        OutboxHeldEvent.objects.filter(topic=held.topic, key=held.key).order_by("position").first()
    )
    raise IllegalTransition(
        f"Event {event.id} has not failed: it waits behind event "
        f"{head.event_id if head else '(gone)'} of its key; retry or discard that one."
    )


def outbox_event_discard(*, event: OutboxEvent) -> OutboxEvent:
    """Gives up on a FAILED event: it gets a DISCARDED delivery record, the row stays for
    audit, and its key's later events flow on."""
    if not held_events_discard(event_ids=[event.id]):
        current = outbox_event_delivered(event_id=event.id)
        if current.delivery_discarded_at is not None:
            # Still FAILED by its last try: "only FAILED events" would not say why.
            raise IllegalTransition(f"Event {event.id} is already discarded.")
        raise IllegalTransition(
            f"Only FAILED events can be discarded; event {event.id} is {current.delivery_status}."
        )
    # The next event of its key is the head now, due at once.
    relays_wake_on_commit()
    return outbox_event_delivered(event_id=event.id)


def outbox_event_replay(*, event: OutboxEvent, new_event_id: bool) -> OutboxEvent:
    """Publishes a DONE (or discarded) event again.

    With the same event id, consumers recognise the copy and count it as a duplicate; with
    a new event id they process it again, and the header `replay_of` names the original.
    The same id is held as the last event of its key; a new one is a new event.
    """
    current = outbox_event_delivered(event_id=event.id)
    if current.delivery_status != OutboxEvent.Status.DONE and current.delivery_discarded_at is None:
        raise IllegalTransition(
            f"Only published or discarded events can be replayed; event {event.id} is "
            f"{current.delivery_status}: retry it instead."
        )
    if new_event_id:
        return _replay_as_new_event(event)
    if not held_event_replay(
        event_id=event.id,
        topic=event.topic,
        key=event.key,
        transaction_id=event.transaction_id,
        position=event.position,
        created_at=event.created_at,
    ):
        raise IllegalTransition(f"Event {event.id} changed meanwhile; nothing to replay.")
    relays_wake_on_commit()
    return outbox_event_delivered(event_id=event.id)


def outbox_key_release(*, topic: str, key: str) -> int:
    """Lets a held key flow again: discards its FAILED events and makes an event waiting for
    its backoff due now. Returns how many events it changed."""
    changed = held_key_release(topic=topic, key=key)
    if changed:
        relays_wake_on_commit()
    return changed


def _replay_as_new_event(event: OutboxEvent) -> OutboxEvent:
    """A new event with the payload of `event`; the header `replay_of` names the original."""
    with transaction.atomic():
        return outbox_event_publish(
            aggregate_type=event.aggregate_type,
            aggregate_id=event.aggregate_id,
            event_type=event.event_type,
            payload=event.payload,
            topic=event.topic,
            key=event.key,
            headers={**event.headers, REPLAY_OF_HEADER: str(event.id)},
        )


# --- bulk repairs ------------------------------------------------------------------------------
# A bulk repair changes the rows its single-row counterpart would, in one statement per chunk:
# the console runs it over ids frozen when the operator submitted.


def outbox_events_retry(*, event_ids: Sequence[uuid.UUID | str]) -> int:
    """outbox_event_retry() for many events: the failed ones (FAILED, or held waiting for
    their backoff) are sent again now, with a fresh set of attempts. Returns how many
    changed."""
    if not event_ids:
        return 0
    changed = held_events_retry(event_ids=event_ids)
    if changed:
        relays_wake_on_commit()
    return changed


def outbox_events_discard(*, event_ids: Sequence[uuid.UUID | str]) -> int:
    """outbox_event_discard() for many events: FAILED ones are kept for audit, discarded."""
    if not event_ids:
        return 0
    discarded = held_events_discard(event_ids=event_ids)
    if discarded:
        relays_wake_on_commit()
    return discarded


def outbox_events_replay(*, event_ids: Sequence[uuid.UUID | str], new_event_id: bool) -> int:
    """outbox_event_replay() for each DONE or discarded event; others are skipped."""
    replayed = 0
    events = outbox_events_with_delivery(OutboxEvent.objects.filter(pk__in=list(event_ids))).filter(
        Q(delivery_status=OutboxEvent.Status.DONE) | Q(delivery_discarded_at__isnull=False)
    )
    for event in events.order_by("position"):
        try:
            outbox_event_replay(event=event, new_event_id=new_event_id)
        except IllegalTransition:
            continue  # changed by someone else meanwhile
        replayed += 1
    return replayed
