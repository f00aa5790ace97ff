"""Inbox errors. Each has a stable `code` that the API and the admin show as they are."""


class InboxError(Exception):
    code = "inbox_error"


class DuplicateHandler(InboxError):
    """Two handlers for one (group, event type): which one runs would be an accident."""

    code = "duplicate_handler"


class NoHandlers(InboxError):
    """A consumer was asked to run for a group that has no handlers and no topics."""

    code = "no_handlers"


class InvalidTransition(InboxError):
    """A service was asked for a status change the inbox does not allow."""

    code = "invalid_transition"


class ConcurrentDelivery(InboxError):
    """Another transaction recorded an event of the batch while this one ran its handlers
    (two consumers briefly own one partition during a rebalance): the batch's transaction
    rolls back and the batch is delivered again, then as a duplicate."""

    code = "concurrent_delivery"


class PositionGap(InboxError):
    """A batch starts past the next offset the database holds for its partition: the
    database lost the transactions of the records between (a primary that failed over
    without its last commits), or holds no record there (offsets of transaction markers,
    compacted or deleted records). The batch's transaction rolls back, and the consumer reads
    the partition again from the offset the database holds (InboxConsumer)."""

    code = "position_gap"

    def __init__(self, stored: dict[tuple[str, int], int], first: dict[tuple[str, int], int]):
        self.stored = stored
        gaps = ", ".join(
            f"{topic}[{partition}] at {first[(topic, partition)]}, stored {offset}"
            for (topic, partition), offset in sorted(stored.items())
        )
        super().__init__(f"the batch starts past the stored next offset: {gaps}")


class ImproperlyConfiguredInbox(InboxError):
    code = "improperly_configured"


# Reasons a record is poison: recorded as a FAILED row with these codes in last_error.
class PoisonRecord(InboxError):
    code = "poison_record"


class MissingEventId(PoisonRecord):
    code = "missing_event_id"


class InvalidPayload(PoisonRecord):
    code = "invalid_payload"


class InvalidHeaders(PoisonRecord):
    code = "invalid_headers"


class UnknownEventType(PoisonRecord):
    code = "unknown_event_type"


class NoHandlerForRetry(InboxError):
    code = "no_handler"
