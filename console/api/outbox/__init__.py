"""REST API of the outbox: /api/outbox/events/."""
