"""Errors publish() raises. Each has a stable `code` the API reports and a message that says
what was wrong and what to do."""


class OutboxError(Exception):
    code = "outbox_error"


class NotInTransaction(OutboxError):
    code = "not_in_transaction"


class InvalidPayload(OutboxError):
    code = "invalid_payload"


class PayloadTooLarge(OutboxError):
    code = "payload_too_large"


class InvalidEvent(OutboxError):
    code = "invalid_event"


class DuplicateEvent(OutboxError):
    code = "duplicate_event"


class IllegalTransition(OutboxError):
    code = "illegal_transition"
