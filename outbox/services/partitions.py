"""The day partitions of the event and delivery tables (migration 0014): reading them,
creating them ahead of time, and dropping one whose rows retention no longer needs.

Each table is partitioned by range of one timestamp, one partition per day in UTC, named
`<table>_pYYYYMMDD`, plus a DEFAULT partition for rows no partition covers (beat's
maintenance did not run; a clock far off). The table that existed before partitioning is the
partition of everything before the migration's next day.

Every change here runs with a lock timeout (OUTBOX["PARTITION_LOCK_TIMEOUT_MS"]). Dropping a
partition takes an ACCESS EXCLUSIVE lock on its table, which waits for every transaction that
has read or written the table (a `pg_dump` reads it from start to end), and each publish()
queued behind that lock would wait as long: with a timeout the drop gives up instead and is
tried at the next run.
"""

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from psycopg import sql
from psycopg.errors import LockNotAvailable

from outbox.conf import outbox_settings

logger = logging.getLogger(__name__)

# Each partitioned table and the column it is partitioned by.
PARTITION_COLUMNS = {"outbox_event": "created_at", "outbox_delivery": "published_at"}
# Days beyond today that have a partition: beat's hourly maintenance has two days to run
# before a row would land in the DEFAULT partition.
DAYS_AHEAD = 2

# A BRIN index built on an empty table summarizes its first range of pages at once, and every
# insert into a summarized range writes a WAL record to widen the summary (72 bytes for an
# event). Without that summary the range's inserts write nothing to the index until
# autosummarize summarizes the range, once the next one starts.
DESUMMARIZE_FIRST_RANGE_SQL = """
SELECT brin_desummarize_range(index.indexrelid, 0)
FROM pg_index AS index
JOIN pg_class AS class ON class.oid = index.indexrelid
JOIN pg_am AS method ON method.oid = class.relam
WHERE index.indrelid = %s::regclass AND method.amname = 'brin'
"""
_BOUNDS = re.compile(r"FOR VALUES FROM \((?P<lower>.+?)\) TO \((?P<upper>.+?)\)")


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    # The range [lower, upper); lower None: from the beginning. Both None: DEFAULT.
    lower: datetime | None
    upper: datetime | None

    @property
    def is_default(self) -> bool:
        return self.upper is None

    def covers(self, day: date) -> bool:
        start = day_start(day)
        return (
            not self.is_default
            and (self.lower is None or self.lower <= start)
            and self.upper is not None
            and self.upper >= start + timedelta(days=1)
        )


def day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _bound(text: str) -> datetime | None:
    return None if text == "MINVALUE" else datetime.fromisoformat(text.strip("'"))


def partitions_read(*, table: str) -> list[Partition]:
    """The partitions of `table`, oldest first, DEFAULT last."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT child.relname, pg_get_expr(child.relpartbound, child.oid)
            FROM pg_inherits JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid
            WHERE pg_inherits.inhparent = %s::regclass
            """,
            [table],
        )
        rows = cursor.fetchall()
    partitions = []
    for name, bound in rows:
        match = _BOUNDS.search(bound)
        if match is None:
            partitions.append(Partition(name=name, lower=None, upper=None))
        else:
            partitions.append(
                Partition(name=name, lower=_bound(match["lower"]), upper=_bound(match["upper"]))
            )
    return sorted(
        partitions,
        key=lambda partition: (
            partition.is_default,
            partition.lower or datetime.min.replace(tzinfo=UTC),
        ),
    )


def default_partition(table: str) -> str:
    return f"{table}_default"


class PartitionLocked(Exception):
    """The lock a partition change needs did not come within OUTBOX["PARTITION_LOCK_TIMEOUT_MS"];
    nothing was changed."""


@contextmanager
def _ddl_transaction() -> Iterator[CursorWrapper]:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, true)",
                [f"{outbox_settings.PARTITION_LOCK_TIMEOUT_MS}ms"],
            )
            yield cursor
    except OperationalError as error:
        if isinstance(error.__cause__, LockNotAvailable):
            raise PartitionLocked(str(error)) from error
        raise


def _columns(cursor: CursorWrapper, table: str) -> sql.Composable:
    cursor.execute(
        """
        SELECT attname FROM pg_attribute
        WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum
        """,
        [table],
    )
    return sql.SQL(", ").join(sql.Identifier(row[0]) for row in cursor.fetchall())


def partitions_create_ahead(*, table: str, today: date | None = None) -> list[str]:
    """Creates the partitions of `table` missing from today to DAYS_AHEAD days on. Returns
    their names."""
    today = today or datetime.now(UTC).date()
    existing = partitions_read(table=table)
    created = []
    for offset in range(DAYS_AHEAD + 1):
        day = today + timedelta(days=offset)
        if not any(partition.covers(day) for partition in existing):
            created.append(partition_create(table=table, day=day))
    return created


def partition_create(*, table: str, day: date) -> str:
    """Creates the partition of one day. It is made as a table of its own and attached: an
    ATTACH locks the partitioned table in SHARE UPDATE EXCLUSIVE mode, which does not stop the
    inserts into the other partitions (CREATE TABLE ... PARTITION OF would), only the DEFAULT
    partition, which ATTACH scans. Rows of that day found in the DEFAULT partition move into
    the new one."""
    return partition_range_create(
        table=table,
        name=f"{table}_p{day:%Y%m%d}",
        lower=day_start(day),
        upper=day_start(day + timedelta(days=1)),
    )


def partition_range_create(*, table: str, name: str, lower: datetime, upper: datetime) -> str:
    """Creates the partition `name` of `table` for [lower, upper), as partition_create makes a
    day's (a benchmark makes shorter ones)."""
    with _ddl_transaction() as cursor:
        columns = _columns(cursor, table)
        cursor.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(
                sql.Identifier(name), sql.Identifier(table)
            )
        )
        default = sql.Identifier(default_partition(table))
        cursor.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(default))
        cursor.execute(
            sql.SQL(
                "WITH moved AS (DELETE FROM {default} WHERE {column} >= %s AND {column} < %s"
                " RETURNING {columns}) INSERT INTO {name} ({columns}) SELECT * FROM moved"
            ).format(
                default=default,
                column=sql.Identifier(PARTITION_COLUMNS[table]),
                columns=columns,
                name=sql.Identifier(name),
            ),
            [lower, upper],
        )
        if cursor.rowcount:
            logger.warning(
                "Moved %d rows from %s from the DEFAULT partition into the new partition %s",
                cursor.rowcount,
                lower,
                name,
            )
        cursor.execute(
            sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM (%s) TO (%s)").format(
                sql.Identifier(table), sql.Identifier(name)
            ),
            [lower, upper],
        )
        cursor.execute(DESUMMARIZE_FIRST_RANGE_SQL, [name])
    return name


def partition_drop(
    *,
    table: str,
    partition: Partition,
    ready: sql.SQL,
    keep: sql.Composable,
    params: Mapping[str, Any] | None = None,
) -> int | None:
    """Drops `partition` of `table` if `ready` (a query of one boolean, which may name the
    partition as {partition}) holds under the table's lock. The rows for which `keep` (a
    condition on the partition's rows) holds are moved into the DEFAULT
    partition first: no other covers their range any longer. Returns how many rows went, or
    None when nothing was dropped (not ready, or dropped meanwhile)."""
    name = sql.Identifier(partition.name)
    with _ddl_transaction() as cursor:
        # Counted before the lock, which holds back every publish(): a row committed since
        # makes `ready` false, and nothing is dropped.
        cursor.execute(sql.SQL("SELECT count(*) FROM {}").format(name))
        rows = cursor.fetchone()[0]
        cursor.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(table))
        )
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s))",
            [partition.name],
        )
        if not cursor.fetchone()[0]:
            return None
        cursor.execute(ready.format(partition=name), params)
        if not cursor.fetchone()[0]:
            return None
        columns = _columns(cursor, table)
        cursor.execute(
            sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(sql.Identifier(table), name)
        )
        cursor.execute(
            sql.SQL(
                "INSERT INTO {table} ({columns}) SELECT {columns} FROM {partition} WHERE "
            ).format(table=sql.Identifier(table), columns=columns, partition=name)
            + keep,
            params,
        )
        kept = cursor.rowcount
        cursor.execute(sql.SQL("DROP TABLE {}").format(name))
    return rows - kept
