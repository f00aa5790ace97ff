"""The outbox's settings: the project's dict OUTBOX, each key defaulting to DEFAULTS.

    OUTBOX = {"BATCH_SIZE": 500, "MAX_ATTEMPTS": 5}

Read them through `outbox_settings.BATCH_SIZE`. This project's settings fill the dict from
environment variables of the same names: OUTBOX_BATCH_SIZE=500 sets OUTBOX["BATCH_SIZE"].
"""

from typing import Any

from kafka_events.conf import AppSettings

DEFAULTS: dict[str, Any] = {
    # Topic of an event when publish() is given none, with {aggregate_type} and {event_type};
    # Debezium's outbox router routes the same way.
    "TOPIC_TEMPLATE": "outbox.event.{aggregate_type}",
    # Under Kafka's default 1 MB record limit (message.max.bytes), leaving room for headers.
    "MAX_PAYLOAD_BYTES": 900 * 1024,
    # publish() prepares its INSERT on each connection; off behind a pooler that cannot keep
    # prepared statements (PgBouncer in transaction mode before 1.21).
    "PUBLISH_PREPARED": True,
    # Seconds between beat's runs of the relay (a whole number: django-celery-beat stores
    # whole seconds); a relay run loops while it finds full batches. The project's
    # CELERY_BEAT_SCHEDULE runs outbox.tasks.relay this often.
    "RELAY_INTERVAL": 1.0,
    # Events the relay reads and produces per batch, and the payload bytes (as PostgreSQL
    # stores them: compressed when large) a batch holds at most, past its first event.
    "BATCH_SIZE": 1000,
    "BATCH_MAX_BYTES": 16 * 1024 * 1024,
    # A relay run stops looping after this many seconds, so overlapping beat ticks stay short.
    "RELAY_MAX_RUN_SECONDS": 10.0,
    # Sends the relay task when a transaction that published events commits.
    "NUDGE_ON_COMMIT": True,
    # ... at most once per this many milliseconds in all processes together (through Redis).
    "NUDGE_MIN_INTERVAL_MS": 100,
    # The Redis that counts those milliseconds for all processes; None: CELERY_BROKER_URL when
    # it is a Redis URL. Without one the limit holds per process only (check outbox.W001).
    "NUDGE_REDIS_URL": None,
    # A failed event holds its key and is tried again after RETRY_BASE_SECONDS, doubling up to
    # RETRY_MAX_SECONDS (with jitter), until MAX_ATTEMPTS are spent: then it waits for an
    # operator. RETRY_MAX_SECONDS also bounds the relay's pause while Kafka is unreachable.
    "RETRY_BASE_SECONDS": 1.0,
    "RETRY_MAX_SECONDS": 300.0,
    "MAX_ATTEMPTS": 10,
    # Producer (librdkafka). Idempotence, acks=all and at most 5 requests in flight are fixed.
    "PRODUCER_LINGER_MS": 5,
    "PRODUCER_BATCH_SIZE": 1024 * 1024,
    "PRODUCER_COMPRESSION": "lz4",
    # How long a record may take to be delivered (message.timeout.ms) before it counts as a
    # failed attempt.
    "PRODUCER_DELIVERY_TIMEOUT_MS": 30_000,
    # Extra librdkafka producer properties, {"key": "value"}. Those the relay sets itself (the
    # fixed ones, the delivery timeout, the transaction's id and timeout) are refused by check
    # outbox.E007.
    "PRODUCER_CONFIG": {},
    # Each batch in a Kafka transaction with a stable transactional.id per relay slot, so a
    # zombie relay is fenced. See docs/outbox.md for what it guarantees and costs.
    "RELAY_TRANSACTIONAL": False,
    "TRANSACTIONAL_ID_PREFIX": "outbox-relay",
    # Events older than this many days are dropped by beat with their day partition once the
    # relay is past them (see docs/outbox.md, Retention); the DEFAULT partition is deleted
    # from in batches of RETENTION_BATCH_SIZE rows.
    "RETENTION_DAYS": 7,
    "RETENTION_BATCH_SIZE": 5000,
    # How long retention's partition changes wait for a lock on the event or delivery table
    # before giving up until the next run: publish() calls queue behind a waiting drop.
    "PARTITION_LOCK_TIMEOUT_MS": 500,
}

outbox_settings = AppSettings(
    "OUTBOX", DEFAULTS, check_id="outbox", label="the outbox", types={"NUDGE_REDIS_URL": str}
)
