"""Prometheus metrics of the relay. The pending count and the age of the oldest pending event
are read from the database when scraped (see outbox.selectors), so every process agrees."""

from prometheus_client import Counter, Histogram

PUBLISHED = Counter("outbox_events_published", "Events the broker confirmed", ["topic"])
FAILED = Counter("outbox_events_failed", "Events marked FAILED after their last attempt", ["topic"])
RETRIED = Counter(
    "outbox_events_retried", "Failed publish attempts scheduled for another try", ["topic"]
)
PUBLISH_LAG = Histogram(
    "outbox_publish_lag_seconds",
    "published_at - created_at of published events",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
