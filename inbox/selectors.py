"""Reads of the inbox."""

from collections.abc import Iterable

from django.db.models import Count, Q
from django.utils import timezone

from inbox.models import ConsumerOffset, InboxMessage


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
