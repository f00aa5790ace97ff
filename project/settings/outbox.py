"""Outbox knobs: the dict OUTBOX of outbox/conf.py, where each key is documented with its
default. Each key is read from the variable OUTBOX_<KEY> when it is set: OUTBOX_BATCH_SIZE=500
sets OUTBOX["BATCH_SIZE"]; dicts are key=value,key=value, booleans true or false."""

from project.settings.environment import env_settings

OUTBOX = env_settings(
    "OUTBOX_",
    {
        "TOPIC_TEMPLATE": str,
        "MAX_PAYLOAD_BYTES": int,
        "PUBLISH_PREPARED": bool,
        "RELAY_INTERVAL": float,
        "BATCH_SIZE": int,
        "BATCH_MAX_BYTES": int,
        "RELAY_MAX_RUN_SECONDS": float,
        "NUDGE_ON_COMMIT": bool,
        "NUDGE_MIN_INTERVAL_MS": int,
        "NUDGE_REDIS_URL": str,
        "RETRY_BASE_SECONDS": float,
        "RETRY_MAX_SECONDS": float,
        "MAX_ATTEMPTS": int,
        "PRODUCER_LINGER_MS": int,
        "PRODUCER_BATCH_SIZE": int,
        "PRODUCER_COMPRESSION": str,
        "PRODUCER_DELIVERY_TIMEOUT_MS": int,
        "PRODUCER_CONFIG": dict,
        "RELAY_TRANSACTIONAL": bool,
        "TRANSACTIONAL_ID_PREFIX": str,
        "RETENTION_DAYS": int,
        "RETENTION_BATCH_SIZE": int,
        "PARTITION_LOCK_TIMEOUT_MS": int,
    },
)
