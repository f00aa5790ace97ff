"""Prometheus metrics of the inbox, labelled by consumer group."""

from collections.abc import Iterable

from prometheus_client import Counter, Histogram

CONSUMED = Counter("inbox_consumed", "Records read from Kafka.", ["group"])
PROCESSED = Counter("inbox_processed", "Messages whose handler succeeded.", ["group"])
DUPLICATES = Counter(
    "inbox_duplicates", "Deliveries of an event the group had already recorded.", ["group"]
)
FAILED = Counter(
    "inbox_failed",
    "Handler failures (reason=handler) and poison records (reason=poison).",
    ["group", "reason"],
)
IGNORED = Counter("inbox_ignored", "Records of an event type with no handler.", ["group"])
DEFERRED = Counter(
    "inbox_deferred", "Messages left to the retry task when a batch ran out of time.", ["group"]
)
PARKED = Counter(
    "inbox_parked",
    "Messages recorded behind an earlier message of their key that is not done (ordering key).",
    ["group"],
)
HANDLER_SECONDS = Histogram(
    "inbox_handler_seconds",
    "Time a handler ran, savepoint included.",
    ["group"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CONSUME_LAG_SECONDS = Histogram(
    "inbox_consume_lag_seconds",
    "processed_at - published_at of messages processed by their handler.",
    ["group"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
BATCH_SECONDS = Histogram(
    "inbox_batch_seconds", "Time to record one batch, commit included.", ["group"]
)


def observe_all(histogram: Histogram, group: str, values: Iterable[float]) -> None:
    child = histogram.labels(group)
    for value in values:
        child.observe(value)
