"""Delivery records: one appended row per try of an event."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

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


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    event_id: uuid.UUID
    outcome: OutboxDelivery.Outcome
    published_at: datetime
    partition: int | None = None
    offset: int | None = None
    error: str = ""
    # How long the try took, in whole milliseconds (OutboxDelivery.duration_ms).
    duration_ms: int | None = None


def deliveries_insert(*, relay_id: str, records: Sequence[DeliveryRecord]) -> None:
    if not records:
        return
    with connection.cursor() as db:
        db.execute(
            """
            INSERT INTO outbox_delivery (event_id, outcome, published_at, kafka_partition,
                                         kafka_offset, error, duration_ms, relay)
            SELECT record.*, %s
            FROM unnest(%s::uuid[], %s::varchar[], %s::timestamptz[], %s::integer[],
                        %s::bigint[], %s::text[], %s::integer[]) AS record
            """,
            [
                relay_id,
                [r.event_id for r in records],
                [r.outcome.value for r in records],
                [r.published_at for r in records],
                [r.partition for r in records],
                [r.offset for r in records],
                [r.error for r in records],
                [r.duration_ms for r in records],
            ],
        )
