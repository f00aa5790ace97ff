"""The operators' repairs: retry, discard, replay, release a quarantined key, singly and in
bulk. Each refuses an illegal transition with IllegalTransition; the console checks the
permission and records who did what.

With the event-log relay (OUTBOX_RELAY_LOG) the event row is never changed: a repair acts on
the held set and appends delivery records (outbox.services.event_log)."""

import uuid
from collections.abc import Sequence

from django.conf import settings
from django.db import transaction
from django.db.models import Func, Q, Value
from django.utils import timezone

from outbox.errors import (
    IllegalTransition,
)
from outbox.models import POSITION_SEQUENCE, OutboxEvent, OutboxHeldEvent
from outbox.selectors import outbox_event_delivered, outbox_events_with_delivery
from outbox.services import event_log
from outbox.services.publish import outbox_event_publish

REPLAY_OF_HEADER = "replay_of"


def _not_leased() -> Q:
    # A row a relay holds may be on its way to Kafka right now: clearing its lease would let
    # another relay send it a second time. Its outcome (DONE, or a retry) comes soon enough.
    return Q(locked_until__isnull=True) | Q(locked_until__lt=timezone.now())


def outbox_event_retry(*, event: OutboxEvent) -> OutboxEvent:
    """Sends a FAILED event (or a PENDING one waiting for its backoff) again, now, with a
    fresh set of attempts. An event a relay is sending at this moment is left to it."""
    if settings.OUTBOX_RELAY_LOG:
        return _held_event_retry(event)
    if event.status == OutboxEvent.Status.DONE:
        raise IllegalTransition(
            f"Event {event.id} is already published; replay it instead of retrying it."
        )
    if event.discarded_at is not None:
        raise IllegalTransition(f"Event {event.id} was discarded; replay it to send it again.")
    updated = (
        OutboxEvent.objects.filter(_not_leased(), pk=event.pk, discarded_at__isnull=True)
        .exclude(status=OutboxEvent.Status.DONE)
        .update(
            status=OutboxEvent.Status.PENDING,
            attempts=0,
            next_attempt_at=timezone.now(),
            locked_until=None,
            locked_by="",
        )
    )
    if not updated:
        if OutboxEvent.objects.filter(pk=event.pk).exclude(_not_leased()).exists():
            raise IllegalTransition(
                f"Event {event.id} is being sent by a relay right now; its outcome is recorded "
                "within the lease, retry it after that if it is not DONE."
            )
        raise IllegalTransition(f"Event {event.id} changed meanwhile; nothing to retry.")
    event.refresh_from_db()
    return event


def outbox_event_discard(*, event: OutboxEvent) -> OutboxEvent:
    """Gives up on a FAILED event. The row stays for audit; its key's later events flow on."""
    if settings.OUTBOX_RELAY_LOG:
        if not event_log.held_events_discard(event_ids=[event.id]):
            raise IllegalTransition(
                f"Only FAILED events can be discarded; event {event.id} is "
                f"{outbox_event_delivered(event_id=event.id).delivery_status}."
            )
        return outbox_event_delivered(event_id=event.id)
    if event.status != OutboxEvent.Status.FAILED:
        raise IllegalTransition(
            f"Only FAILED events can be discarded; event {event.id} is {event.status}."
        )
    updated = OutboxEvent.objects.filter(
        pk=event.pk, status=OutboxEvent.Status.FAILED, discarded_at__isnull=True
    ).update(discarded_at=timezone.now())
    if not updated:
        raise IllegalTransition(f"Event {event.id} is already discarded.")
    event.refresh_from_db()
    return event


def outbox_event_replay(*, event: OutboxEvent, new_event_id: bool) -> OutboxEvent:
    """Publishes a DONE (or discarded) event again.

    With the same event id, consumers recognise the copy and count it as a duplicate; with
    a new event id they process it again, and the header `replay_of` names the original.
    """
    if settings.OUTBOX_RELAY_LOG:
        return _held_event_replay(event, new_event_id=new_event_id)
    if event.status != OutboxEvent.Status.DONE and event.discarded_at is None:
        raise IllegalTransition(
            f"Only published or discarded events can be replayed; event {event.id} is "
            f"{event.status}: retry it instead."
        )
    if new_event_id:
        return _replay_as_new_event(event)
    previous = (
        f"replayed by an operator; previously published to partition {event.kafka_partition} "
        f"at offset {event.kafka_offset} on {event.published_at}"
        if event.status == OutboxEvent.Status.DONE
        else "replayed by an operator after being discarded"
    )
    # Back into the queue behind the key's current events: a replay is a new publication.
    with transaction.atomic():
        updated = (
            OutboxEvent.objects.filter(pk=event.pk)
            .filter(Q(status=OutboxEvent.Status.DONE) | Q(discarded_at__isnull=False))
            .update(
                status=OutboxEvent.Status.PENDING,
                attempts=0,
                last_error=previous,
                next_attempt_at=timezone.now(),
                discarded_at=None,
                locked_until=None,
                locked_by="",
                position=Func(Value(POSITION_SEQUENCE), function="nextval"),
            )
        )
    if not updated:
        raise IllegalTransition(f"Event {event.id} changed meanwhile; nothing to replay.")
    event.refresh_from_db()
    return event


def outbox_key_release(*, topic: str, key: str) -> int:
    """Lets a quarantined key flow again: discards its FAILED events and makes an event
    waiting for its backoff due now. Returns how many events it changed."""
    if settings.OUTBOX_RELAY_LOG:
        return event_log.held_key_release(topic=topic, key=key)
    now = timezone.now()
    with transaction.atomic():
        discarded = OutboxEvent.objects.filter(
            topic=topic, key=key, status=OutboxEvent.Status.FAILED, discarded_at__isnull=True
        ).update(discarded_at=now)
        made_due = OutboxEvent.objects.filter(
            topic=topic, key=key, status=OutboxEvent.Status.PENDING, next_attempt_at__gt=now
        ).update(next_attempt_at=now)
    return discarded + made_due


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


def _held_event_retry(event: OutboxEvent) -> OutboxEvent:
    if event_log.held_events_retry(event_ids=[event.id]):
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
        OutboxHeldEvent.objects.filter(topic=held.topic, key=held.key)
        .order_by("transaction_id", "position")
        .first()
    )
    raise IllegalTransition(
        f"Event {event.id} has not failed: it waits behind event "
        f"{head.event_id if head else '(gone)'} of its key; retry or discard that one."
    )


def _held_event_replay(event: OutboxEvent, *, new_event_id: bool) -> OutboxEvent:
    current = outbox_event_delivered(event_id=event.id)
    if current.delivery_status != OutboxEvent.Status.DONE and current.delivery_discarded_at is None:
        raise IllegalTransition(
            f"Only published or discarded events can be replayed; event {event.id} is "
            f"{current.delivery_status}: retry it instead."
        )
    if new_event_id:
        return _replay_as_new_event(event)
    if not event_log.held_event_replay(event_id=event.id, topic=event.topic, key=event.key):
        raise IllegalTransition(f"Event {event.id} changed meanwhile; nothing to replay.")
    return outbox_event_delivered(event_id=event.id)


# --- bulk repairs ------------------------------------------------------------------------------
# A bulk repair changes the rows its single-row counterpart would, in one statement per chunk:
# the console runs it over ids frozen when the operator submitted.


def outbox_events_retry(*, event_ids: Sequence[uuid.UUID | str]) -> int:
    """outbox_event_retry() for many events: the ones not DONE, not discarded and not being
    sent by a relay are sent again now, with a fresh set of attempts. Returns how many
    changed."""
    if not event_ids:
        return 0
    if settings.OUTBOX_RELAY_LOG:
        return event_log.held_events_retry(event_ids=event_ids)
    return (
        OutboxEvent.objects.filter(_not_leased(), pk__in=list(event_ids), discarded_at__isnull=True)
        .exclude(status=OutboxEvent.Status.DONE)
        .update(
            status=OutboxEvent.Status.PENDING,
            attempts=0,
            next_attempt_at=timezone.now(),
            locked_until=None,
            locked_by="",
            updated_at=timezone.now(),
        )
    )


def outbox_events_discard(*, event_ids: Sequence[uuid.UUID | str]) -> int:
    """outbox_event_discard() for many events: FAILED ones are kept for audit, discarded."""
    if not event_ids:
        return 0
    if settings.OUTBOX_RELAY_LOG:
        return event_log.held_events_discard(event_ids=event_ids)
    return OutboxEvent.objects.filter(
        pk__in=list(event_ids), status=OutboxEvent.Status.FAILED, discarded_at__isnull=True
    ).update(discarded_at=timezone.now(), updated_at=timezone.now())


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
