"""Transactional outbox: `outbox.publish()` records an event in the caller's transaction."""

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.models import OutboxEvent


def publish(
    *,
    aggregate_type: str,
    aggregate_id: Any,
    event_type: str,
    payload: Any,
    topic: str | None = None,
    key: str | None = None,
    headers: Mapping[str, Any] | None = None,
    event_id: uuid.UUID | str | None = None,
) -> "OutboxEvent":
    """Records an event in the current database transaction; see outbox.services.publish."""
    # Imported here: this package is imported while Django loads its apps, before models can be.
    from outbox.services.publish import outbox_event_publish

    return outbox_event_publish(
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        event_type=event_type,
        payload=payload,
        topic=topic,
        key=key,
        headers=headers,
        event_id=event_id,
    )
