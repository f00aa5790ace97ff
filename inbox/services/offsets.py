"""The stored next offset of each partition a consumer group reads, moved in the transaction
of the effects. Exactly-once groups seek to it at assignment and skip the records below it;
every group checks a new database session's first batches against it (InboxConsumer)."""

from collections.abc import Sequence

from django.db import connection

from inbox.errors import InvalidTransition
from inbox.records import InboxRecord


def _require_atomic() -> None:
    if not connection.in_atomic_block:
        raise InvalidTransition("Call this inside transaction.atomic().")


def consumer_offsets_lock(
    *, group: str, records: Sequence[InboxRecord]
) -> dict[tuple[str, int], int]:
    """Locks, for the rest of the transaction, the stored next offsets of the partitions in
    `records`, creating missing rows at the batch's first offset. Call inside atomic()."""
    _require_atomic()
    first: dict[tuple[str, int], int] = {}
    for record in records:
        key = (record.topic, record.partition)
        first[key] = min(first.get(key, record.offset), record.offset)
    if not first:
        return {}
    topics = [topic for topic, _ in first]
    partitions = [partition for _, partition in first]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO inbox_consumer_offset (consumer_group, topic, "partition", next_offset,
                updated_at)
            SELECT %s, t.topic, t.partition, t.next_offset, now()
            FROM unnest(%s::text[], %s::integer[], %s::bigint[]) AS t(topic, partition, next_offset)
            ON CONFLICT (consumer_group, topic, "partition") DO NOTHING
            """,
            [group, topics, partitions, list(first.values())],
        )
        cursor.execute(
            """
            SELECT o.topic, o.partition, o.next_offset FROM inbox_consumer_offset AS o
            JOIN unnest(%s::text[], %s::integer[]) AS t(topic, partition)
                ON o.topic = t.topic AND o.partition = t.partition
            WHERE o.consumer_group = %s
            ORDER BY o.topic, o.partition
            FOR UPDATE OF o
            """,
            [topics, partitions, group],
        )
        return {(topic, partition): offset for topic, partition, offset in cursor.fetchall()}


def consumer_offsets_advance(*, group: str, next_offsets: dict[tuple[str, int], int]) -> None:
    """Stores the next offset to read per partition, creating missing rows, never moving one
    back, in one statement (after consumer_offsets_lock() or without it). Call inside the
    transaction of the effects."""
    _require_atomic()
    if not next_offsets:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO inbox_consumer_offset (consumer_group, topic, "partition", next_offset,
                updated_at)
            SELECT %s, t.topic, t.partition, t.next_offset, now()
            FROM unnest(%s::text[], %s::integer[], %s::bigint[]) AS t(topic, partition, next_offset)
            ORDER BY t.topic, t.partition
            ON CONFLICT (consumer_group, topic, "partition") DO UPDATE
            SET next_offset = GREATEST(inbox_consumer_offset.next_offset, EXCLUDED.next_offset),
                updated_at = EXCLUDED.updated_at
            """,
            [
                group,
                [topic for topic, _ in next_offsets],
                [partition for _, partition in next_offsets],
                list(next_offsets.values()),
            ],
        )
