"""Reads of the inbox."""

from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Count, Q, TextField, Value
from django.db.models.functions import Concat
from django.utils import timezone

from inbox.models import HOLDING, ConsumerOffset, InboxMessage


def inbox_message_ids_due_for_retry(*, limit: int) -> list[int]:
    """Due PENDING rows that run on their own: those of groups without order per key, and
    those of ordered groups that hold no key (no key, or released). The others run in their
    key's sequence (inbox.services.sequences.runnable_sequences)."""
    from inbox.services.sequences import ordered_groups_q

    return list(
        InboxMessage.objects.filter(
            status=InboxMessage.Status.PENDING, next_attempt_at__lte=timezone.now()
        )
        .filter(Q(key__isnull=True) | Q(released_at__isnull=False) | ~ordered_groups_q())
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )


def inbox_message_counts_by_status(*, consumer_group: str) -> dict[str, int]:
    rows = (
        InboxMessage.objects.filter(consumer_group=consumer_group)
        .values("status")
        .annotate(count=Count("id"))
    )
    return {row["status"]: row["count"] for row in rows}


def consumer_offsets_for(
    *, group: str, partitions: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """The stored next offsets of an exactly-once group, for the partitions it was assigned."""
    wanted = set(partitions)
    topics = {topic for topic, _ in wanted}
    rows = ConsumerOffset.objects.filter(consumer_group=group, topic__in=topics).values_list(
        "topic", "partition", "next_offset"
    )
    return {(t, p): offset for t, p, offset in rows if (t, p) in wanted}


@dataclass(frozen=True)
class HeldKey:
    """A key held in a group with ordering "key": its head and how many rows wait behind it."""

    consumer_group: str
    topic: str
    key: str
    parked: int
    head: InboxMessage


def inbox_held_keys(
    *,
    consumer_group: str | None = None,
    topic: str | None = None,
    key: str | None = None,
    limit: int = 100,
) -> list[HeldKey]:
    """The held keys of the groups with ordering "key" (of one group, topic or key when they
    are given), the longest held first (by the head's receipt), read from the index of the
    rows that hold their key."""
    from inbox.services.sequences import ordered_groups_q

    rows = InboxMessage.objects.filter(HOLDING & ordered_groups_q())
    for name, value in (("consumer_group", consumer_group), ("topic", topic), ("key", key)):
        if value is not None:
            rows = rows.filter(**{name: value})
    keys = list(
        rows.values("consumer_group", "topic", "key")
        .annotate(
            parked=Count("id", filter=Q(status=InboxMessage.Status.PARKED)),
            head_id=ArrayAgg("id", order_by=("partition", "offset")),
        )
        .order_by()
    )
    heads = InboxMessage.objects.defer("payload", "headers", "raw_value").in_bulk(
        [key["head_id"][0] for key in keys]
    )
    held = [
        # The rows that hold a key have one.
        HeldKey(
            key["consumer_group"], key["topic"], key["key"] or "", key["parked"], heads[head_id]
        )
        for key in keys
        if (head_id := key["head_id"][0]) in heads
    ]
    held.sort(key=lambda key: key.head.received_at)
    return held[:limit]


def inbox_held_key_counts() -> dict[str, tuple[int, int]]:
    """Per group with ordering "key": how many keys are held, and how many messages are parked
    behind them."""
    from inbox.services.sequences import ordered_groups_q

    rows = (
        InboxMessage.objects.filter(HOLDING & ordered_groups_q())
        .values("consumer_group")
        .annotate(
            keys=Count(
                Concat("topic", Value("\x1f"), "key", output_field=TextField()), distinct=True
            ),
            parked=Count("id", filter=Q(status=InboxMessage.Status.PARKED)),
        )
        .order_by()
    )
    return {row["consumer_group"]: (row["keys"], row["parked"]) for row in rows}
