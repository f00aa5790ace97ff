"""The inbox's settings: the project's dict INBOX, each key defaulting to DEFAULTS.

    INBOX = {"BATCH_SIZE": 200, "EXACTLY_ONCE_GROUPS": ["billing"]}

Read them through `inbox_settings.BATCH_SIZE`. This project's settings fill the dict from
environment variables of the same names: INBOX_BATCH_SIZE=200 sets INBOX["BATCH_SIZE"].
"""

from typing import Any

from kafka_events.conf import AppSettings

DEFAULTS: dict[str, Any] = {
    # Messages recorded per database transaction (and per offset commit). Bigger batches are
    # faster; a batch is redelivered whole if the consumer dies before its commit.
    "BATCH_SIZE": 500,
    # How long one poll waits for the first message of a batch; also how quickly a consumer
    # notices SIGTERM when its topics are idle.
    "POLL_TIMEOUT_SECONDS": 1.0,
    # Where a group with no committed offset starts: "earliest" never skips events published
    # before the group's first start.
    "AUTO_OFFSET_RESET": "earliest",
    # librdkafka drops a consumer from its group when it does not poll for this long. A batch
    # stops starting handlers after BATCH_MAX_SECONDS; the rest of the batch is recorded as
    # due for retry, so slow handlers never exceed it.
    "MAX_POLL_INTERVAL_MS": 300_000,
    # None: a third of MAX_POLL_INTERVAL_MS (100 seconds with its default).
    "BATCH_MAX_SECONDS": None,
    # Extra librdkafka consumer properties, {"key": "value"}. The inbox's guarantees (manual
    # commit, manual offset store, read_committed) cannot be overridden here.
    "CONSUMER_CONFIG": {},
    # The consumer group protocol: "classic", or "consumer" (KIP-848, Kafka 4: the broker
    # assigns partitions incrementally and decides sessions and heartbeats).
    "GROUP_PROTOCOL": "classic",
    # A handler that raises is retried by beat from the stored payload, with exponential
    # backoff and jitter: RETRY_BASE_SECONDS * 2**(attempts-1), at most RETRY_MAX_SECONDS.
    # After MAX_ATTEMPTS attempts the row is FAILED until an operator replays it.
    "MAX_ATTEMPTS": 8,
    "RETRY_BASE_SECONDS": 2.0,
    "RETRY_MAX_SECONDS": 3600.0,
    # Seconds between beat's runs of inbox.tasks.retry_due (the project's
    # CELERY_BEAT_SCHEDULE); one run handles at most RETRY_BATCH_SIZE rows.
    "RETRY_INTERVAL": 5.0,
    "RETRY_BATCH_SIZE": 200,
    # An event type with no handler in the consuming group: "ignore" counts it (metric
    # inbox_ignored_total) and moves on; "fail" records it as a FAILED row, like a poison record.
    "UNKNOWN_EVENT_TYPE": "ignore",
    # Groups in exactly-once mode: the next offset of each partition is stored in the database
    # transaction of the effects (inbox.ConsumerOffset) and the consumer seeks to it on
    # assignment, so a crash between the database commit and the Kafka commit redelivers nothing.
    "EXACTLY_ONCE_GROUPS": [],
    # Deduplication by (group, event id). Switch it off only for handlers that are idempotent
    # themselves, or to test exactly-once mode alone: a redelivered event then runs again.
    "DEDUPLICATE": True,
    # Order per key: "key" (a row whose handler failed holds the later events of its key in its
    # group, PARKED, until it succeeds or an operator skips or releases it) or "none" (every
    # event runs on its own; a failed one is retried later, after the newer ones of its key).
    "ORDERING": "key",
    # The ordering of some groups, in place of ORDERING: {"analytics": "none", "delivery": "key"}.
    "GROUP_ORDERING": {},
    # DONE rows older than this many days (by processed_at) are deleted by beat. The inbox row
    # is what recognises a redelivery as a duplicate, so this must exceed the longest time after
    # which the same event can arrive again: the topic's retention (Kafka deletes whole log
    # segments, so a record can be read for retention.ms + segment.ms after it was written: 7 +
    # 7 days by default, and an offset reset or a new replica of the group replays that far
    # back), the outbox relay's retry window, and any manual replay. Delete the row earlier and
    # a late redelivery runs its handler a second time. Checked by inbox.W001 and by
    # inbox_consume at start (docs/inbox.md).
    "RETENTION_DAYS": 14,
    # Rows deleted per statement (each in its own short transaction), and statements per run.
    "RETENTION_BATCH_SIZE": 5000,
    "RETENTION_MAX_BATCHES": 100,
}

inbox_settings = AppSettings(
    "INBOX",
    DEFAULTS,
    check_id="inbox",
    label="the inbox",
    types={"BATCH_MAX_SECONDS": float},
    derived={"BATCH_MAX_SECONDS": lambda inbox: inbox.MAX_POLL_INTERVAL_MS / 1000 / 3},
)
