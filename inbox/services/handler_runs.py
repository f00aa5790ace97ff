"""Running one handler: in a savepoint of the caller's transaction, its error kept for
last_error."""

import logging
import time
import traceback
from typing import Any

from django.db import connection, transaction

from inbox.models import InboxMessage
from inbox.registry import Handler

logger = logging.getLogger(__name__)

# last_error keeps the error's type and message and the innermost frames of its traceback.
TRACEBACK_FRAMES = 5
LAST_ERROR_MAX_CHARS = 4000


def error_class(error: BaseException) -> str:
    """The exception's module and qualified name, as last_error starts."""
    return f"{type(error).__module__}.{type(error).__qualname__}"


def format_error(error: BaseException) -> str:
    kind = error_class(error)
    frames = "".join(traceback.format_tb(error.__traceback__)[-TRACEBACK_FRAMES:])
    return f"{kind}: {error}\n{frames}"[:LAST_ERROR_MAX_CHARS]


# The savepoint a handler runs in; handlers run one after another, so one name serves all.
HANDLER_SAVEPOINT = "inbox_handler"


class _LazySavepoint:
    """Issues the handler's SAVEPOINT just before its first query (a Django execute wrapper),
    so a handler that touches no table costs no round trip; one that does gets the same
    savepoint, as early as it can matter."""

    def __init__(self) -> None:
        self.created = False

    def __call__(self, execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        if not self.created:
            _raw_execute(f"SAVEPOINT {HANDLER_SAVEPOINT}")
            self.created = True
        return execute(sql, params, many, context)


def _raw_execute(sql: str) -> None:
    # Straight to psycopg: Django's cursor would run the execute wrappers again.
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        cursor.execute(sql)


def _run_handler(entry: Handler, message: InboxMessage) -> tuple[BaseException | None, float]:
    """Runs a handler in a savepoint: on failure its writes and its on_commit callbacks are
    discarded, the rest of the transaction is kept. Handlers write through Django's default
    connection (its ORM or connection.cursor()); that is what the savepoint covers."""
    started = time.perf_counter()
    savepoint = _LazySavepoint()
    callbacks = len(connection.run_on_commit)
    error: BaseException | None = None
    try:
        with connection.execute_wrapper(savepoint):
            entry.function(message)
        if savepoint.created:
            _raw_execute(f"RELEASE SAVEPOINT {HANDLER_SAVEPOINT}")
    except Exception as caught:
        error = caught
        if savepoint.created:
            _raw_execute(f"ROLLBACK TO SAVEPOINT {HANDLER_SAVEPOINT}")
            _raw_execute(f"RELEASE SAVEPOINT {HANDLER_SAVEPOINT}")
        # What the handler asked to run after commit belongs to the work just undone.
        del connection.run_on_commit[callbacks:]
        # The transaction is usable again (a failed query in the handler marked it broken).
        transaction.set_rollback(False)
        logger.warning(
            "Handler %s failed on %s %s: %s",
            entry.name,
            message.event_type,
            message.event_id,
            error,
        )
    return error, time.perf_counter() - started
