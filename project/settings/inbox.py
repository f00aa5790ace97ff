"""Inbox knobs: consumers, retries and retention."""

from project.settings.environment import env

# Messages recorded per database transaction (and per offset commit). Bigger batches are
# faster; a batch is redelivered whole if the consumer dies before its commit.
INBOX_BATCH_SIZE = env.int("INBOX_BATCH_SIZE", default=500)
# How long one poll waits for the first message of a batch; also how quickly a consumer
# notices SIGTERM when its topics are idle.
INBOX_POLL_TIMEOUT_SECONDS = env.float("INBOX_POLL_TIMEOUT_SECONDS", default=1.0)
# Where a group with no committed offset starts: "earliest" never skips events published
# before the group's first start.
INBOX_AUTO_OFFSET_RESET = env("INBOX_AUTO_OFFSET_RESET", default="earliest")
# librdkafka drops a consumer from its group when it does not poll for this long. A batch
# stops starting handlers after INBOX_BATCH_MAX_SECONDS (default: a third of this); the rest
# of the batch is recorded as due for retry, so slow handlers never exceed it.
INBOX_MAX_POLL_INTERVAL_MS = env.int("INBOX_MAX_POLL_INTERVAL_MS", default=300_000)
INBOX_BATCH_MAX_SECONDS = env.float(
    "INBOX_BATCH_MAX_SECONDS", default=INBOX_MAX_POLL_INTERVAL_MS / 1000 / 3
)
# Extra librdkafka consumer properties, key=value,key=value. The inbox's guarantees
# (manual commit, manual offset store, read_committed) cannot be overridden here.
INBOX_CONSUMER_CONFIG: dict[str, str] = env.dict("INBOX_CONSUMER_CONFIG", default={})
# The consumer group protocol: "classic", or "consumer" (KIP-848, Kafka 4: the broker assigns
# partitions incrementally and decides sessions and heartbeats).
INBOX_GROUP_PROTOCOL = env("INBOX_GROUP_PROTOCOL", default="classic")

# A handler that raises is retried by beat from the stored payload, with exponential
# backoff and jitter: base * 2**(attempts-1), at most INBOX_RETRY_MAX_SECONDS. After
# INBOX_MAX_ATTEMPTS attempts the row is FAILED until an operator replays it.
INBOX_MAX_ATTEMPTS = env.int("INBOX_MAX_ATTEMPTS", default=8)
INBOX_RETRY_BASE_SECONDS = env.float("INBOX_RETRY_BASE_SECONDS", default=2.0)
INBOX_RETRY_MAX_SECONDS = env.float("INBOX_RETRY_MAX_SECONDS", default=3600.0)
# Beat runs inbox.tasks.retry_due this often; one run handles at most this many rows.
INBOX_RETRY_INTERVAL = env.float("INBOX_RETRY_INTERVAL", default=5.0)
INBOX_RETRY_BATCH_SIZE = env.int("INBOX_RETRY_BATCH_SIZE", default=200)

# An event type with no handler in the consuming group: "ignore" counts it (metric
# inbox_ignored_total) and moves on; "fail" records it as a FAILED row, like a poison record.
INBOX_UNKNOWN_EVENT_TYPE = env("INBOX_UNKNOWN_EVENT_TYPE", default="ignore")

# Groups in exactly-once mode: the next offset of each partition is stored in the database
# transaction of the effects (inbox.ConsumerOffset) and the consumer seeks to it on
# assignment, so a crash between the database commit and the Kafka commit redelivers nothing.
INBOX_EXACTLY_ONCE_GROUPS: list[str] = env.list("INBOX_EXACTLY_ONCE_GROUPS", default=[])
# Deduplication by (group, event id). Switch it off only for handlers that are idempotent
# themselves, or to test exactly-once mode alone: a redelivered event then runs again.
INBOX_DEDUPLICATE = env.bool("INBOX_DEDUPLICATE", default=True)

# Order per key: "key" (a row whose handler failed holds the later events of its key in its
# group, PARKED, until it succeeds or an operator skips or releases it) or "none" (every
# event runs on its own; a failed one is retried later, after the newer ones of its key).
INBOX_ORDERING = env("INBOX_ORDERING", default="key")
# Per group: INBOX_GROUP_ORDERING=analytics=none,delivery=key
INBOX_GROUP_ORDERING: dict[str, str] = env.dict("INBOX_GROUP_ORDERING", default={})

# DONE rows older than this many days (by processed_at) are deleted by beat. The inbox row is
# what recognises a redelivery as a duplicate, so this must exceed the longest time after
# which the same event can arrive again: the topic's retention (Kafka deletes whole log
# segments, so a record can be read for retention.ms + segment.ms after it was written: 7 + 7
# days by default, and an offset reset or a new replica of the group replays that far back),
# the outbox relay's retry window, and any manual replay. Delete the row earlier and a late
# redelivery runs its handler a second time. Checked by inbox.W001 and by inbox_consume at
# start (docs/inbox.md).
INBOX_RETENTION_DAYS = env.int("INBOX_RETENTION_DAYS", default=14)
# Rows deleted per statement (each in its own short transaction), and statements per run.
INBOX_RETENTION_BATCH_SIZE = env.int("INBOX_RETENTION_BATCH_SIZE", default=5000)
INBOX_RETENTION_MAX_BATCHES = env.int("INBOX_RETENTION_MAX_BATCHES", default=100)
