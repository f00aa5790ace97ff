"""Failure injection for crash tests: the consumer kills itself at a named point.

Inert unless the environment variable INBOX_FAULT_INJECT names a point, e.g.
INBOX_FAULT_INJECT=after_db_commit. Nothing in the product sets it; the crash tests set it
for the subprocess they kill.
"""

import os
import signal

FAULT_ENV_VAR = "INBOX_FAULT_INJECT"

# Inside the batch's database transaction, after the handlers ran, before COMMIT.
BEFORE_DB_COMMIT = "before_db_commit"
# After the database COMMIT, before the offsets are committed to Kafka.
AFTER_DB_COMMIT = "after_db_commit"
POINTS = frozenset({BEFORE_DB_COMMIT, AFTER_DB_COMMIT})


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV_VAR) == name:
        # SIGKILL: no finally blocks, no close(), no flush; what a power cut leaves behind.
        os.kill(os.getpid(), signal.SIGKILL)
