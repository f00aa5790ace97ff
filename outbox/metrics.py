"""Prometheus metrics of the relay. The pending count and the age of the oldest pending event
are read from the database when scraped (see outbox.selectors), so every process agrees."""

from bisect import bisect_right
from collections.abc import Iterable

from prometheus_client import Counter, Histogram


class BatchHistogram(Histogram):
    """A histogram that also takes a batch's observations at once: a few calls per bucket,
    where observe() takes a lock and walks the buckets for each value."""

    def observe_many(self, amounts: Iterable[float]) -> None:
        """As observe() for each of `amounts` (without exemplars)."""
        ordered = sorted(amounts)
        if not ordered:
            return
        self._raise_if_not_observable()
        self._sum.inc(sum(ordered))
        below = 0
        # Each bucket counts the values above the bound before it, up to its own (le).
        for bucket, bound in zip(self._buckets, self._upper_bounds, strict=True):
            up_to = bisect_right(ordered, bound)
            if up_to > below:
                bucket.inc(up_to - below)
            below = up_to


PUBLISHED = Counter("outbox_events_published", "Events the broker confirmed", ["topic"])
FAILED = Counter("outbox_events_failed", "Events marked FAILED after their last attempt", ["topic"])
RETRIED = Counter(
    "outbox_events_retried", "Failed publish attempts scheduled for another try", ["topic"]
)
PUBLISH_LAG = BatchHistogram(
    "outbox_publish_lag_seconds",
    "published_at - created_at of published events",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
