"""The scenarios' own, isolated set of services, and the faults injected into it.

Every fault acts on this set only (its own LOCAL_DIR and ports, through scripts/services.sh):
the developers' PostgreSQL, Redis and Kafka on the default ports are never touched."""

import logging
import os
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient
from django.conf import settings

logger = logging.getLogger(__name__)

SERVICES_SCRIPT = Path(settings.BASE_DIR) / "scripts" / "services.sh"
BROKERS = 3
KAFKA_PORT_BASE = 19091
KAFKA_CONTROLLER_PORT_BASE = 39091
BOOTSTRAP_SERVERS = ",".join(
    f"127.0.0.1:{KAFKA_PORT_BASE + node}" for node in range(1, BROKERS + 1)
)
DATABASE_URL = "postgres://outbox:outbox@127.0.0.1:55432/scenarios"
REDIS_URL = "redis://127.0.0.1:56379/0"
# How long a restarted broker may take to be back in every partition's in-sync replicas.
ISR_WAIT_SECONDS = 120.0


def local_dir() -> Path:
    return Path(settings.BASE_DIR) / ".local" / "scenarios"


def isolated_environment() -> dict[str, str]:
    """The variables that point services.sh and Django at the scenarios' services."""
    return {
        "LOCAL_DIR": str(local_dir()),
        "DATABASE_URL": DATABASE_URL,
        "CELERY_BROKER_URL": REDIS_URL,
        "KAFKA_BROKERS": str(BROKERS),
        "KAFKA_PORT_BASE": str(KAFKA_PORT_BASE),
        "KAFKA_CONTROLLER_PORT_BASE": str(KAFKA_CONTROLLER_PORT_BASE),
        "KAFKA_BOOTSTRAP_SERVERS": BOOTSTRAP_SERVERS,
    }


def is_isolated() -> bool:
    """True when this process's settings point at the isolated services."""
    database = settings.DATABASES["default"]
    return (
        settings.KAFKA_BOOTSTRAP_SERVERS == BOOTSTRAP_SERVERS
        and str(database.get("PORT")) == DATABASE_URL.rsplit(":", 1)[1].split("/")[0]
        and database.get("NAME") == "scenarios"
        and settings.CELERY_BROKER_URL == REDIS_URL
    )


def services(command: str, *arguments: str, timeout: float = 300.0) -> str:
    """Runs `scripts/services.sh command arguments` on the isolated set; returns its output."""
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


def admin() -> AdminClient:
    return AdminClient({"bootstrap.servers": BOOTSTRAP_SERVERS})


def partition_leader(topic: str, partition: int = 0) -> int:
    metadata = admin().list_topics(topic, timeout=30)
    return int(metadata.topics[topic].partitions[partition].leader)


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


def kafka_kill(node: int) -> None:
    services("kafka-kill", str(node))


def kafka_stop(node: int) -> None:
    services("kafka-stop", str(node))


def kafka_start(node: int) -> None:
    services("kafka-start", str(node))


def kafka_pause(node: int) -> None:
    services("kafka-pause", str(node))


def kafka_resume(node: int) -> None:
    services("kafka-resume", str(node))


def postgres_crash() -> None:
    services("postgres-crash")


def postgres_start() -> None:
    services("postgres-start")


def redis_stop() -> None:
    services("redis-stop")


def redis_start() -> None:
    services("redis-start")
