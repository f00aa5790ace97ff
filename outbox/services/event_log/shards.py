"""Shards: a key's shard, and the advisory locks by which a relay owns its shards and the
relays count each other."""

from collections.abc import Sequence

from django.core.exceptions import ImproperlyConfigured
from django.db import connection

# A key belongs to shard (hashtext(key) & 2147483647) % SHARD_COUNT for good: the migration
# that created the cursors wrote this number into them.
SHARD_COUNT = 16
ALL_SHARDS = tuple(range(SHARD_COUNT))
# The first key of the two-key advisory locks by which a relay owns its shards.
SHARD_LOCK_CLASS = 0x6F62_7478
# The first key of the advisory lock each running relay holds while it runs: the relays count
# each other by these locks, to share the shards.
RELAY_LOCK_CLASS = SHARD_LOCK_CLASS + 1
SHARD_SQL = f"mod(hashtext({{key}}) & 2147483647, {SHARD_COUNT})"
# Where Django's connection keeps its database connection and that one's session process id.
BACKEND_PID_ATTRIBUTE = "outbox_backend_pid"


def shard_of(key: str) -> int:
    """The shard of `key`, as PostgreSQL computes it."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {SHARD_SQL.format(key='%s')}", [key])
        return int(cursor.fetchone()[0])


def shards_lock(*, shards: Sequence[int], limit: int | None = None) -> list[int]:
    """Takes up to `limit` of the shards no other relay owns, in order, for as long as this
    database session lasts."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT shard FROM unnest(%s::int[]) WITH ORDINALITY AS wanted(shard, place) "
            "WHERE pg_try_advisory_lock(%s, shard) ORDER BY place LIMIT %s",
            [list(shards), SHARD_LOCK_CLASS, limit],
        )
        return [row[0] for row in cursor.fetchall()]


def relay_join(*, relay_id: str) -> None:
    """Counts this session as a running relay (relays_running) until it leaves or ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_lock(%s, hashtext(%s))", [RELAY_LOCK_CLASS, relay_id]
        )


def relay_leave(*, relay_id: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", [RELAY_LOCK_CLASS, relay_id])


def relays_running() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM pg_locks
            WHERE locktype = 'advisory' AND classid = %s::bigint::oid AND objsubid = 2
              AND granted AND database = (SELECT oid FROM pg_database
                                          WHERE datname = current_database())
            """,
            [RELAY_LOCK_CLASS],
        )
        return int(cursor.fetchone()[0])


def shards_unlock(*, shards: Sequence[int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_unlock(%s, shard) FROM unnest(%s::int[]) AS shard",
            [SHARD_LOCK_CLASS, list(shards)],
        )


def backend_pid() -> int:
    """The process id of this connection's database session, asked once per connection (the
    relay checks it before every batch). Asked of the server, not of libpq: behind a pooler
    libpq knows the pooler's id, which pg_backend_pid() in batch_record would never match."""
    connection.ensure_connection()
    database_connection = connection.connection
    known: tuple[object, int] | None = getattr(connection, BACKEND_PID_ATTRIBUTE, None)
    if known is not None and known[0] is database_connection:
        return known[1]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    setattr(connection, BACKEND_PID_ATTRIBUTE, (database_connection, pid))
    return pid


class RelayNeedsItsSession(ImproperlyConfigured):
    """The relay's database connection does not keep one server session between its
    transactions: it goes through a pooler in transaction mode."""


def server_session_handed_on() -> int | None:
    """The process id of this connection's server session when that session is handed to
    other clients between transactions, as a pooler in transaction mode does; else None.

    Asked by a second connection to the same place: a pooler in transaction mode gives it the
    server connection this one just released (PgBouncer reuses the most recently used one
    first), so both see one process id; directly, or in session mode, this connection keeps
    its own."""
    pid = backend_pid()
    probe = connection.get_new_connection(connection.get_connection_params())
    try:
        with probe.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            other = int(cursor.fetchone()[0])
    finally:
        probe.close()
    return pid if other == pid else None


def session_kept_check() -> None:
    """Raises RelayNeedsItsSession when this connection's server session is handed to other
    clients between transactions (server_session_handed_on). The relay owns its shards by
    advisory locks of its session, which there would stay with a server connection some other
    client uses (no relay could take those shards until the pooler closed it), and it LISTENs
    and keeps a temporary table in its session."""
    pid = server_session_handed_on()
    if pid is not None:
        raise RelayNeedsItsSession(
            "The outbox relay needs a database session of its own, and its connection goes "
            "through a pooler in transaction mode: two of its connections got one server "
            f"session (process {pid}). Give the relay's processes (manage.py outbox_relay, and "
            "the Celery workers that run outbox.tasks.relay) a DATABASES['default'] that "
            "reaches PostgreSQL directly or through a pool in session mode (in this project: "
            "their DATABASE_URL). Publishing and consuming work through either mode."
        )


class ShardLost(Exception):
    """This session no longer holds the shards' locks (it ended, or its locks were dropped):
    another relay may own them now."""


# Whether this session holds the advisory lock of each of the shards %(shards)s. Asked of the
# locks themselves, not of the session's process id alone: behind a pooler in session mode, a
# client's new connection may get the server session of its old one, reset by DISCARD ALL
# (which drops advisory locks), under the same process id.
SHARDS_HELD_SQL = f"""
(SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
   AND classid = {SHARD_LOCK_CLASS}::bigint::oid AND objsubid = 2
   AND objid::bigint = ANY(%(shards)s::bigint[])
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
) = cardinality(%(shards)s::bigint[])"""  # noqa: S608 (constants only)
