"""The scenarios' own, isolated set of services, and the faults injected into it.

Every fault acts on this set only (its own LOCAL_DIR and ports, through scripts/services.sh):
the developers' PostgreSQL, Redis and Kafka on the default ports are never touched, nor the
isolated services of another checkout (scenarios/ports.py)."""

import logging
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis
from confluent_kafka.admin import AdminClient
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from kafka_events.conf import kafka_settings
from scenarios import ports
from scenarios.secured_kafka import SecuredKafka, tls_ca

logger = logging.getLogger(__name__)

SERVICES_SCRIPT = Path(settings.BASE_DIR) / "scripts" / "services.sh"
BROKERS = ports.BROKERS
DATABASE_NAME = "scenarios"
# How long a restarted broker may take to be back in every partition's in-sync replicas.
ISR_WAIT_SECONDS = 120.0


def bootstrap_servers(block: ports.PortBlock | None = None) -> str:
    block = block or ports.recorded_block()
    return ",".join(f"127.0.0.1:{block.kafka(node)}" for node in range(1, BROKERS + 1))


def secured_bootstrap_servers(block: ports.PortBlock | None = None) -> str:
    """The brokers' SASL_SSL listeners (TLS, SCRAM users, ACLs: scenarios/secured_kafka.py)."""
    block = block or ports.recorded_block()
    return ",".join(
        f"127.0.0.1:{block.kafka_secure_port_base + node}" for node in range(1, BROKERS + 1)
    )


def isolated_environment(block: ports.PortBlock | None = None) -> dict[str, str]:
    """The variables that point services.sh and Django at the scenarios' services."""
    block = block or ports.recorded_block()
    return {
        "LOCAL_DIR": str(ports.local_dir()),
        "DATABASE_URL": f"postgres://outbox:outbox@127.0.0.1:{block.postgres}/{DATABASE_NAME}",
        "PGBOUNCER_PORT": str(block.session_pool),
        "PGBOUNCER_TRANSACTION_PORT": str(block.transaction_pool),
        "PG_STANDBY_PORT": str(block.standby),
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{block.redis}/0",
        "KAFKA_BROKERS": str(BROKERS),
        "KAFKA_PORT_BASE": str(block.kafka_port_base),
        "KAFKA_CONTROLLER_PORT_BASE": str(block.controller_port_base),
        "KAFKA_SECURE_PORT_BASE": str(block.kafka_secure_port_base),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers(block),
    }


def is_isolated() -> bool:
    """True when this process's settings point at this checkout's isolated services."""
    block = ports.recorded_block()
    environment = isolated_environment(block)
    database = settings.DATABASES["default"]
    return (
        environment["KAFKA_BOOTSTRAP_SERVERS"] == kafka_settings.BOOTSTRAP_SERVERS
        and str(database.get("PORT")) == str(block.postgres)
        and database.get("NAME") == DATABASE_NAME
        and environment["CELERY_BROKER_URL"] == settings.CELERY_BROKER_URL
    )


def services(command: str, *arguments: str, timeout: float = 300.0) -> str:
    """Runs `scripts/services.sh command arguments` on the isolated set; returns its output.
    `up` first claims the ports (scenarios/ports.py): the set that answers is this
    checkout's own, or it starts on ports nobody else uses."""
    if command == "up":
        claim_ports()
    result = subprocess.run(
        [str(SERVICES_SCRIPT), command, *arguments],
        env={**os.environ, **isolated_environment()},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"services.sh {command} {' '.join(arguments)} failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout


def claim_ports() -> ports.PortBlock:
    """Makes sure the recorded ports are this checkout's, moving them if another holds them."""
    return ports.claim_port_block(stop_own=lambda: services("down"))


def running() -> bool:
    """Whether any of this checkout's isolated services runs."""
    return bool(ports.own_pids())


def admin() -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers()})


def secured_kafka() -> SecuredKafka:
    """Users and ACLs of the isolated cluster's secured listener."""
    return SecuredKafka(
        admin(), bootstrap=secured_bootstrap_servers(), ca=tls_ca(ports.local_dir())
    )


def partition_leaders(topic: str) -> dict[int, int]:
    """The leader of each partition of `topic` as the cluster's metadata has it (-1: none)."""
    metadata = admin().list_topics(topic, timeout=30)
    return {number: int(p.leader) for number, p in metadata.topics[topic].partitions.items()}


def partition_leader(topic: str, partition: int = 0, *, timeout: float = 60.0) -> int:
    """The broker leading `partition`; waits while it has none (-1, an election under way)
    and raises if it still has none after `timeout`: a fault aimed at "the leader" needs one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            leader = partition_leaders(topic).get(partition, -1)
        except Exception as error:  # a broker in the middle of a restart: ask again
            logger.debug("metadata of %s unavailable: %s", topic, error)
            leader = -1
        if leader >= 0:
            return leader
        if time.monotonic() >= deadline:
            raise RuntimeError(f"partition {partition} of {topic} has no leader after {timeout} s")
        time.sleep(0.5)


def wait_leader_moved(
    topic: str, partition: int, away_from: int, *, timeout: float = 60.0
) -> int | None:
    """Waits until another broker than `away_from` leads `partition` (the controller moved
    leadership off a broker it fenced or that shut down); returns it, or None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            leader = partition_leaders(topic).get(partition, -1)
        except Exception as error:
            logger.debug("metadata of %s unavailable: %s", topic, error)
            leader = -1
        if leader >= 0 and leader != away_from:
            return leader
        time.sleep(0.5)
    return None


def wait_leaders_off(topic: str, broker: int, *, timeout: float = 60.0) -> dict[int, int] | None:
    """Waits until every partition of `topic` has a leader other than `broker`; returns the
    leaders, or None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            leaders = partition_leaders(topic)
        except Exception as error:
            logger.debug("metadata of %s unavailable: %s", topic, error)
            leaders = {}
        if leaders and all(leader >= 0 and leader != broker for leader in leaders.values()):
            return leaders
        time.sleep(0.5)
    return None


def wait_in_sync(topic: str, *, replicas: int = BROKERS, timeout: float = ISR_WAIT_SECONDS) -> bool:
    """Waits until every partition of `topic` has a leader and `replicas` in-sync replicas."""
    deadline = time.monotonic() + timeout
    client = admin()
    while time.monotonic() < deadline:
        try:
            metadata = client.list_topics(topic, timeout=10)
            partitions = metadata.topics[topic].partitions.values()
            if partitions and all(p.leader >= 0 and len(p.isrs) >= replicas for p in partitions):
                return True
        except Exception as error:  # a broker in the middle of a restart: ask again
            logger.debug("metadata of %s unavailable: %s", topic, error)
        time.sleep(0.5)
    return False


def _reported(output: str, pattern: str) -> re.Match[str]:
    """The line services.sh printed about the fault it made; its absence is an error."""
    match = re.search(pattern, output)
    if match is None:
        raise RuntimeError(f"services.sh did not report {pattern!r}: {output.strip()!r}")
    return match


@dataclass(frozen=True)
class Stopped:
    pid: int
    # SIGTERM was ignored for services.sh's wait and followed by SIGKILL.
    forced: bool


def _stopped(node: int, output: str) -> Stopped:
    match = _reported(output, rf"node {node} stopped: pid (\d+), SIG\w+( \(ignored)?")
    return Stopped(pid=int(match.group(1)), forced=match.group(2) is not None)


def kafka_kill(node: int) -> int:
    """SIGKILLs broker `node` and waits until its process is gone; returns its pid. Raises
    if the broker was not running."""
    return _stopped(node, services("kafka-kill", str(node))).pid


def kafka_stop(node: int) -> Stopped:
    """SIGTERMs broker `node` (controlled shutdown) and waits until its process is gone.
    Raises if the broker was not running."""
    return _stopped(node, services("kafka-stop", str(node)))


def kafka_start(node: int) -> int:
    """Starts broker `node` again and waits until it serves; returns its new pid. Raises if
    the broker was running: a restart needs it down."""
    output = services("kafka-start", str(node))
    return int(_reported(output, rf"node {node} started: pid (\d+)").group(1))


def kafka_pause(node: int) -> int:
    """SIGSTOPs broker `node` and waits until the kernel shows it stopped; returns its pid.
    Raises if the broker was not running."""
    output = services("kafka-pause", str(node))
    return int(_reported(output, rf"node {node} paused: pid (\d+)").group(1))


def kafka_resume(node: int) -> int:
    """SIGCONTs broker `node` and waits until it runs again; returns its pid."""
    output = services("kafka-resume", str(node))
    return int(_reported(output, rf"node {node} resumed: pid (\d+)").group(1))


def pooled_database_url(port: int) -> str:
    """DATABASE_URL of the scenarios' database through the PgBouncer listening on `port`
    (the block's session_pool or transaction_pool)."""
    return f"postgres://outbox:outbox@127.0.0.1:{port}/{DATABASE_NAME}"


def pool_transactions(port: int) -> int:
    """The transactions the PgBouncer on `port` has passed to the scenarios' database so far
    (its admin console's SHOW STATS)."""
    database = settings.DATABASES["default"]
    with psycopg.connect(
        host="127.0.0.1",
        port=port,
        user=database["USER"],
        password=database["PASSWORD"],
        dbname="pgbouncer",
        autocommit=True,
    ) as console:
        cursor = console.execute("SHOW STATS")
        columns = [column.name for column in cursor.description or ()]
        for row in cursor.fetchall():
            stats = dict(zip(columns, row, strict=True))
            if stats["database"] == DATABASE_NAME:
                return int(stats["total_xact_count"])
    return 0


def postgres_log() -> Path:
    return ports.local_dir() / "postgres" / "postgres.log"


def postgres_crash() -> int:
    """Stops PostgreSQL in immediate mode (no checkpoint: it recovers from the WAL when it
    starts); returns the pid of the postmaster stopped. Raises if it was not running."""
    output = services("postgres-crash")
    return int(_reported(output, r"immediate mode: postmaster pid (\d+)").group(1))


def postgres_start() -> int:
    """Starts PostgreSQL and waits until it accepts connections; returns the new postmaster's
    pid."""
    output = services("postgres-start")
    return int(_reported(output, r"started: postmaster pid (\d+)").group(1))


def failover_database_url() -> str:
    """DATABASE_URL of the scenarios' database on whichever of the block's two servers (the
    primary and its standby) accepts writes: libpq tries both, in order, and skips a server in
    recovery (docs/integration.md, A primary that fails over)."""
    block = ports.recorded_block()
    return (
        f"postgres://outbox:outbox@127.0.0.1:{block.postgres},127.0.0.1:{block.standby}"
        f"/{DATABASE_NAME}?target_session_attrs=read-write&connect_timeout=2"
    )


def postgres_standby(replication: str) -> int:
    """Makes a streaming standby of the scenarios' PostgreSQL on the block's standby port,
    with `sync` or `async` replication; returns its postmaster's pid once it streams."""
    output = services("postgres-standby", replication)
    return int(_reported(output, r"streaming \(\w+\): postmaster pid (\d+)").group(1))


def postgres_kill() -> int:
    """SIGKILLs the primary's postmaster and every backend of it; returns the postmaster's pid."""
    output = services("postgres-kill")
    return int(_reported(output, r"killed: postmaster pid (\d+)").group(1))


def postgres_promote() -> int:
    """Promotes the standby and waits until it accepts writes; returns its postmaster's pid."""
    output = services("postgres-promote")
    return int(_reported(output, r"promoted: postmaster pid (\d+)").group(1))


def postgres_rejoin(replication: str) -> int:
    """Makes the old primary's data folder afresh as a standby of the promoted server and
    starts it on its own port; returns its postmaster's pid once it streams."""
    output = services("postgres-rejoin", replication)
    return int(_reported(output, r"streaming \(\w+\): postmaster pid (\d+)").group(1))


def postgres_switchback() -> int:
    """Stops the promoted standby cleanly and promotes the server on the block's PostgreSQL
    port again; returns its postmaster's pid."""
    output = services("postgres-switchback")
    return int(_reported(output, r"primary on port \d+ again: postmaster pid (\d+)").group(1))


def _superuser_session(port: int) -> psycopg.Connection:
    # The scenarios' server trusts local connections (initdb -A trust in services.sh).
    return psycopg.connect(
        host="127.0.0.1",
        port=port,
        user="postgres",
        dbname="postgres",
        autocommit=True,
        connect_timeout=5,
    )


STANDBY_NAME = "standby"  # its application_name (services.sh's PG_STANDBY_NAME)


def postgres_replication_stop() -> int:
    """SIGSTOPs the primary's WAL sender to its standby: the standby falls behind (a network
    partition, a standby's slow disk) while the primary goes on; returns the sender's pid.
    Nothing resumes it: the primary's SIGKILL ends it."""
    with _superuser_session(ports.recorded_block().postgres) as session:
        row = session.execute(
            "SELECT pid FROM pg_stat_replication WHERE application_name = %s", [STANDBY_NAME]
        ).fetchone()
    if row is None:
        raise RuntimeError("the primary has no WAL sender to its standby")
    os.kill(row[0], signal.SIGSTOP)
    return int(row[0])


def replication_lag_bytes() -> int:
    """Bytes of WAL the primary has written and not sent to its standby."""
    with _superuser_session(ports.recorded_block().postgres) as session:
        row = session.execute(
            "SELECT pg_current_wal_lsn() - sent_lsn FROM pg_stat_replication "
            "WHERE application_name = %s",
            [STANDBY_NAME],
        ).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


def commits_waiting_for_standby() -> int:
    """Sessions of the primary whose commit waits for its synchronous standby's flush."""
    with _superuser_session(ports.recorded_block().postgres) as session:
        row = session.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        ).fetchone()
    return int(row[0]) if row is not None else 0


def postgres_refuses(port: int) -> bool:
    """Whether nothing listens on `port` now: the effect of postgres_kill that clients meet."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def postgres_timeline(port: int) -> int:
    """The timeline of the server on `port` (each promotion starts a new one)."""
    with _superuser_session(port) as session:
        # The current WAL file's name starts with the timeline, in hex (pg_control_checkpoint's
        # lags a promotion until the checkpoint that follows it).
        row = session.execute(
            "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
        ).fetchone()
        assert row is not None
        return int(row[0])


def redis_stop() -> int:
    """Stops Redis; returns the pid stopped. Raises if it was not running."""
    output = services("redis-stop")
    return int(_reported(output, r"redis +stopped: pid (\d+)").group(1))


def redis_start() -> None:
    services("redis-start")


def redis_refuses() -> bool:
    """Whether the isolated Redis refuses a connection now: the effect of redis_stop, which
    a client (a Celery worker, beat) meets."""
    client = redis.Redis(
        host="127.0.0.1",
        port=ports.recorded_block().redis,
        socket_connect_timeout=1,
        socket_timeout=1,
        # One try: redis-py retries a refused connection by default, for seconds.
        retry=Retry(NoBackoff(), 0),
    )
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        return True
    except redis.exceptions.TimeoutError:
        return False  # accepted and silent: not the refusal a stopped Redis gives
    finally:
        client.close()
    return False


def kafka_refuses(node: int) -> bool:
    """Whether broker `node`'s listener refuses a connection now: the effect of kafka_kill,
    which its clients meet."""
    try:
        with socket.create_connection(("127.0.0.1", ports.recorded_block().kafka(node)), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False  # a timeout or another failure: not the refusal of a killed broker
