from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
# A `.env` file beside manage.py is optional; real environment variables win over it.
if (BASE_DIR / ".env").is_file():
    env.read_env(BASE_DIR / ".env", overwrite=False)

# Production start-up stops, naming the variable, when one of these is missing.
PRODUCTION_REQUIRED_VARIABLES = ("SECRET_KEY", "DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")

# django-environ's reader of each type: lists and dicts are comma-separated,
# "a,b" and "key=value,key=value"; booleans "true"/"false" (or on/off, yes/no, 1/0).
_READERS: dict[type, Callable[[str], Any]] = {
    int: env.int,
    float: env.float,
    bool: env.bool,
    str: env.str,
    dict: env.dict,
    list: env.list,
}


def env_settings(prefix: str, types: Mapping[str, type]) -> dict[str, Any]:
    """An app's settings dict with the keys whose variable, prefix + key, is set, read as the
    key's type: env_settings("OUTBOX_", {"BATCH_SIZE": int}) is {"BATCH_SIZE": 500} when
    OUTBOX_BATCH_SIZE=500, {} when it is unset. The defaults are the app's own (outbox/conf.py):
    a key left out takes it."""
    return {
        key: _READERS[kind](prefix + key)
        for key, kind in types.items()
        if prefix + key in env.ENVIRON
    }
