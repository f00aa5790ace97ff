"""Delivery records: one appended row per try of an event."""

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from django.db import connection

from outbox.models import OutboxDelivery
from outbox.services.event_log.spans import LogEvent

# A delivery record is never dated before its event (record_time): the reads of one event's
# records look from its created_at on, so that PostgreSQL skips the day partitions of the
# delivery table before it (outbox.selectors). The records migration 0012 made from the claim
# relay's columns carry times from another clock than created_at's (the database's, the
# relay's); the reads allow them this much.
RECORD_CLOCK_MARGIN = timedelta(hours=1)
RECORD_CLOCK_MARGIN_SQL = f"interval '{int(RECORD_CLOCK_MARGIN.total_seconds())} seconds'"


def record_time(event: "LogEvent", moment: datetime) -> datetime:
    """The time a delivery record of `event` carries for `moment`: never before the event's
    created_at. The relay's clock and the publisher's may differ; a record dated before its
    event would put it in a day partition the reads skip, and make a negative lag."""
    return max(moment, event.created_at)


class DeliveryRecord(NamedTuple):
    """One try of an event, as outbox_delivery stores it. A tuple: the relay makes one per
    event it sends."""

    event_id: uuid.UUID
    outcome: OutboxDelivery.Outcome
    published_at: datetime
    partition: int | None = None
    offset: int | None = None
    error: str = ""
    # How long the try took, in whole milliseconds (OutboxDelivery.duration_ms).
    duration_ms: int | None = None


# The columns of outbox_delivery that deliveries_insert writes, in DeliveryRecord's order and
# then the relay's, with the type of each in COPY's binary form.
_COPY_COLUMNS = (
    ("event_id", "uuid"),
    ("outcome", "varchar"),
    ("published_at", "timestamptz"),
    ("kafka_partition", "int4"),
    ("kafka_offset", "int8"),
    ("error", "text"),
    ("duration_ms", "int4"),
    ("relay", "varchar"),
)
_COPY_SQL = (
    f"COPY outbox_delivery ({', '.join(name for name, _ in _COPY_COLUMNS)}) "
    "FROM STDIN (FORMAT BINARY)"
)


def deliveries_insert(*, relay_id: str, records: Sequence[DeliveryRecord]) -> None:
    """Appends the records by COPY in binary form: each row goes from its tuple to the wire in
    psycopg's C code, where an INSERT's arrays would be built and quoted in Python."""
    if not records:
        return
    with connection.cursor() as db, db.cursor.copy(_COPY_SQL) as copy:
        copy.set_types([kind for _, kind in _COPY_COLUMNS])
        write_row = copy.write_row
        for record in records:
            write_row((*record, relay_id))
