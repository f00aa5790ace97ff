"""Event ids: UUIDs of version 7, which carry the time they were made."""

import os
import uuid
from datetime import UTC, datetime, timedelta

from django.utils import timezone

UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
RANDOM_62_BITS = (1 << 62) - 1
# How far an event's created_at may be from the time its drawn id carries: a second covers two
# readings of the clock in one process, and a second of events is a few BRIN ranges to read.
DRAWN_TIME_MARGIN = timedelta(seconds=1)


def time_ordered_event_id(created_at: datetime) -> uuid.UUID:
    """A UUID of version 7 (RFC 9562): the event's creation time in milliseconds, then 74
    random bits. The ids an event table receives rise with time, in about the order the rows
    are appended: the event table's BRIN index on the id finds an event from a few pages of
    summaries (no B-tree, whose insert would cost every publish a WAL record), and each
    consumer's inbox index of event ids grows at its right edge instead of splitting pages all
    over the tree as random ids do."""
    milliseconds = (created_at - UNIX_EPOCH) // timedelta(milliseconds=1)
    random_bits = int.from_bytes(os.urandom(10)) >> 6
    return uuid.UUID(
        int=milliseconds << 80
        | 0x7 << 76
        | (random_bits >> 62) << 64
        | 0b10 << 62
        | random_bits & RANDOM_62_BITS
    )


def new_event_id() -> uuid.UUID:
    """The model's default: an event made through the ORM gets a time-ordered id too."""
    return time_ordered_event_id(timezone.now())


def drawn_time_range(event_id: uuid.UUID) -> tuple[datetime, datetime]:
    """The creation times an event whose id was drawn from the clock can have: around the
    millisecond a version 7 id carries (publish() draws both from one reading of the clock, the
    model's default for an event made through the ORM from another reading than its
    created_at's); an empty range for any other id, which is never drawn."""
    if event_id.version != 7:
        return UNIX_EPOCH, UNIX_EPOCH
    try:
        drawn = UNIX_EPOCH + timedelta(milliseconds=event_id.int >> 80)
        return drawn - DRAWN_TIME_MARGIN, drawn + DRAWN_TIME_MARGIN
    except OverflowError:  # a time after the year 9999, which is never drawn
        return UNIX_EPOCH, UNIX_EPOCH
