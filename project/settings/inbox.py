"""Inbox knobs: the dict INBOX of inbox/conf.py, where each key is documented with its default.
Each key is read from the variable INBOX_<KEY> when it is set: INBOX_BATCH_SIZE=200 sets
INBOX["BATCH_SIZE"]; lists are a,b, dicts key=value,key=value (INBOX_GROUP_ORDERING=
analytics=none,delivery=key), booleans true or false."""

from project.settings.environment import env_settings

INBOX = env_settings(
    "INBOX_",
    {
        "BATCH_SIZE": int,
        "POLL_TIMEOUT_SECONDS": float,
        "AUTO_OFFSET_RESET": str,
        "MAX_POLL_INTERVAL_MS": int,
        "BATCH_MAX_SECONDS": float,
        "CONSUMER_CONFIG": dict,
        "GROUP_PROTOCOL": str,
        "MAX_ATTEMPTS": int,
        "RETRY_BASE_SECONDS": float,
        "RETRY_MAX_SECONDS": float,
        "RETRY_INTERVAL": float,
        "RETRY_BATCH_SIZE": int,
        "UNKNOWN_EVENT_TYPE": str,
        "EXACTLY_ONCE_GROUPS": list,
        "DEDUPLICATE": bool,
        "ORDERING": str,
        "GROUP_ORDERING": dict,
        "RETENTION_DAYS": int,
        "RETENTION_BATCH_SIZE": int,
        "RETENTION_MAX_BATCHES": int,
    },
)
