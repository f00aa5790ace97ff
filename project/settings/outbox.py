"""Outbox knobs: publication, the relay, its producer and retention."""

from project.settings.environment import env

# Topic of an event when publish() is given none; Debezium's outbox router routes the same way.
OUTBOX_TOPIC_TEMPLATE = env("OUTBOX_TOPIC_TEMPLATE", default="outbox.event.{aggregate_type}")
# Under Kafka's default 1 MB record limit (message.max.bytes), leaving room for headers.
OUTBOX_MAX_PAYLOAD_BYTES = env.int("OUTBOX_MAX_PAYLOAD_BYTES", default=900 * 1024)
# publish() prepares its INSERT on each connection; off behind a pooler that cannot keep
# prepared statements (PgBouncer in transaction mode before 1.21).
OUTBOX_PUBLISH_PREPARED = env.bool("OUTBOX_PUBLISH_PREPARED", default=True)

# Beat runs the relay this often; a relay run loops while it finds full batches.
OUTBOX_RELAY_INTERVAL = env.float("OUTBOX_RELAY_INTERVAL", default=1.0)
OUTBOX_BATCH_SIZE = env.int("OUTBOX_BATCH_SIZE", default=1000)
# A relay run stops looping after this long, so overlapping beat ticks stay short.
OUTBOX_RELAY_MAX_RUN_SECONDS = env.float("OUTBOX_RELAY_MAX_RUN_SECONDS", default=10.0)
# Sends the relay task when a transaction that published events commits.
OUTBOX_NUDGE_ON_COMMIT = env.bool("OUTBOX_NUDGE_ON_COMMIT", default=True)
# ... at most once per this many milliseconds in all processes together (through Redis).
OUTBOX_NUDGE_MIN_INTERVAL_MS = env.int("OUTBOX_NUDGE_MIN_INTERVAL_MS", default=100)

# A failed event holds its key and is tried again after the base delay, doubling up to the
# maximum (with jitter), until its attempts are spent: then it waits for an operator.
OUTBOX_RETRY_BASE_SECONDS = env.float("OUTBOX_RETRY_BASE_SECONDS", default=1.0)
OUTBOX_RETRY_MAX_SECONDS = env.float("OUTBOX_RETRY_MAX_SECONDS", default=300.0)
OUTBOX_MAX_ATTEMPTS = env.int("OUTBOX_MAX_ATTEMPTS", default=10)

# Producer (librdkafka). Idempotence, acks=all and at most 5 requests in flight are fixed.
OUTBOX_PRODUCER_LINGER_MS = env.int("OUTBOX_PRODUCER_LINGER_MS", default=5)
OUTBOX_PRODUCER_BATCH_SIZE = env.int("OUTBOX_PRODUCER_BATCH_SIZE", default=1024 * 1024)
OUTBOX_PRODUCER_COMPRESSION = env("OUTBOX_PRODUCER_COMPRESSION", default="lz4")
OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS = env.int("OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS", default=30_000)
# Extra librdkafka producer properties, key=value,key=value.
OUTBOX_PRODUCER_CONFIG: dict[str, str] = env.dict("OUTBOX_PRODUCER_CONFIG", default={})

# Each batch in a Kafka transaction with a stable transactional.id per relay slot, so a
# zombie relay is fenced. See docs/outbox.md for what it guarantees and costs.
OUTBOX_RELAY_TRANSACTIONAL = env.bool("OUTBOX_RELAY_TRANSACTIONAL", default=False)
OUTBOX_TRANSACTIONAL_ID_PREFIX = env("OUTBOX_TRANSACTIONAL_ID_PREFIX", default="outbox-relay")

# Events older than this are dropped by beat with their day partition once the relay is past
# them (see docs/outbox.md, Retention); the DEFAULT partition is deleted from in batches of
# OUTBOX_RETENTION_BATCH_SIZE.
OUTBOX_RETENTION_DAYS = env.int("OUTBOX_RETENTION_DAYS", default=7)
OUTBOX_RETENTION_BATCH_SIZE = env.int("OUTBOX_RETENTION_BATCH_SIZE", default=5000)
# How long retention's partition changes wait for a lock on the event or delivery table
# before giving up until the next run: publish() calls queue behind a waiting drop.
OUTBOX_PARTITION_LOCK_TIMEOUT_MS = env.int("OUTBOX_PARTITION_LOCK_TIMEOUT_MS", default=500)
