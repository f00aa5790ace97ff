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
