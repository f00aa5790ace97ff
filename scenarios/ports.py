"""Where this checkout's isolated services listen, and proof that they are its own.

The scenarios crash brokers and PostgreSQL through this checkout's pid files (under its
`.local/scenarios`). Services of another checkout answering on the same ports would take the
traffic while the faults hit nothing, so before the services start, the ports are claimed:
- a block of ports (PostgreSQL, PgBouncer in session and in transaction mode, PostgreSQL's
  standby, Redis, three brokers and their controllers) is recorded in
  `.local/scenarios/port-block`; block 0 is 25432, 25433-25434, 25435, 26379, 19092-19094,
  19095-19097 (controllers) and 19098-19100 (the brokers' SASL_SSL listeners), block
  n adds n * 100 to each. Every block lies below Linux's ephemeral range (32768-60999 by
  default): a port in it may be the local end of any outgoing connection at the moment a
  service binds it, which no check of listening sockets can foresee;
- the recorded block is kept while every port of it that answers is served by a process whose
  pid this checkout's pid files hold;
- otherwise this checkout's services (if any) are stopped and it moves to the lowest block on
  which nothing answers, saying which process of which folder held the ports.
"""

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)

BROKERS = 3
PORT_BLOCK_STEP = 100
PORT_BLOCKS = 50
# Overrides the folder of the isolated services (default: this checkout's .local/scenarios).
LOCAL_DIR_VARIABLE = "SCENARIOS_LOCAL_DIR"


def local_dir() -> Path:
    configured = os.environ.get(LOCAL_DIR_VARIABLE)
    return Path(configured) if configured else Path(settings.BASE_DIR) / ".local" / "scenarios"


@dataclass(frozen=True)
class PortBlock:
    number: int

    def _port(self, base: int) -> int:
        return base + PORT_BLOCK_STEP * self.number

    @property
    def postgres(self) -> int:
        return self._port(25432)

    @property
    def session_pool(self) -> int:
        """PgBouncer in session mode, in front of the block's PostgreSQL."""
        return self._port(25433)

    @property
    def transaction_pool(self) -> int:
        """PgBouncer in transaction mode."""
        return self._port(25434)

    @property
    def standby(self) -> int:
        """The streaming standby of the block's PostgreSQL (made by the failover scenarios)."""
        return self._port(25435)

    @property
    def redis(self) -> int:
        return self._port(26379)

    @property
    def kafka_port_base(self) -> int:
        """Broker N (1-based) listens on this + N."""
        return self._port(19091)

    @property
    def controller_port_base(self) -> int:
        return self._port(19094)

    @property
    def kafka_secure_port_base(self) -> int:
        """Broker N's SASL_SSL listener is on this + N."""
        return self._port(19097)

    def kafka_secure(self, node: int) -> int:
        return self.kafka_secure_port_base + node

    def kafka(self, node: int) -> int:
        return self.kafka_port_base + node

    def controller(self, node: int) -> int:
        return self.controller_port_base + node

    def ports(self) -> dict[int, str]:
        """Every port of the block, and the service that should answer on it."""
        ports = {
            self.postgres: "postgres",
            self.session_pool: "pgbouncer session",
            self.transaction_pool: "pgbouncer transaction",
            self.standby: "postgres standby",
            self.redis: "redis",
        }
        for node in range(1, BROKERS + 1):
            ports[self.kafka(node)] = f"kafka node {node}"
            ports[self.kafka_secure(node)] = f"kafka node {node}"
            ports[self.controller(node)] = f"kafka node {node}"
        return ports


def _block_file(local: Path) -> Path:
    return local / "port-block"


def recorded_block(local: Path | None = None) -> PortBlock:
    """The block this checkout's services use (block 0 until one was claimed)."""
    try:
        return PortBlock(int(_block_file(local or local_dir()).read_text().strip()))
    except (FileNotFoundError, ValueError):
        return PortBlock(0)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _first_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError, PermissionError):
        return None


def own_pids(local: Path | None = None) -> dict[str, int]:
    """The live processes this checkout's pid files name, by service."""
    local = local or local_dir()
    pid_files = {
        "postgres": local / "postgres" / "data" / "postmaster.pid",
        "postgres standby": local / "postgres" / "standby" / "postmaster.pid",
        "pgbouncer session": local / "pgbouncer" / "session.pid",
        "pgbouncer transaction": local / "pgbouncer" / "transaction.pid",
        "redis": local / "redis" / "redis.pid",
        **{
            f"kafka node {node}": local / "kafka" / f"node-{node}" / "kafka.pid"
            for node in range(1, BROKERS + 1)
        },
    }
    found = {service: _first_int(path) for service, path in pid_files.items()}
    return {service: pid for service, pid in found.items() if pid and alive(pid)}


def listening_sockets() -> dict[int, set[str]]:
    """Port -> inodes of the loopback or wildcard TCP sockets listening on it."""
    listening: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":  # 0A: LISTEN
                port = int(fields[1].rsplit(":", 1)[1], 16)
                listening.setdefault(port, set()).add(fields[9])
    return listening


def listener_pids(port_numbers: set[int]) -> dict[int, set[int]]:
    """Each of `port_numbers` that something listens on -> the pids holding its sockets (an
    empty set: a listener whose process this user may not see). One walk of /proc for all."""
    listening = listening_sockets()
    wanted = {
        f"socket:[{inode}]": port
        for port in port_numbers & set(listening)
        for inode in listening[port]
    }
    owners: dict[int, set[int]] = {port: set() for port in port_numbers & set(listening)}
    if not wanted:
        return owners
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            for fd in (process / "fd").iterdir():
                port = wanted.get(os.readlink(fd))
                if port is not None:
                    owners[port].add(int(process.name))
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return owners


def describe_process(pid: int) -> str:
    """pid, command and working folder: enough to find the checkout it belongs to."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        folder = os.readlink(f"/proc/{pid}/cwd")
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        return f"pid {pid}"
    return f"pid {pid} ({command.strip()[:160]}) in {folder}"


def foreign_listeners(block: PortBlock, local: Path | None = None) -> dict[int, list[int]]:
    """The ports of `block` that processes not started by this checkout listen on, with
    their pids (an empty list: a listener whose process could not be seen)."""
    own = own_pids(local)
    own_set = set(own.values())
    services = block.ports()
    foreign: dict[int, list[int]] = {}
    for port, owners in listener_pids(set(services)).items():
        service = services[port]
        if owners & own_set:
            continue
        # A socket whose owner this user may not see (PostgreSQL runs as its own user): the
        # port is taken as the service's own while that service's pid file names a live pid.
        if not owners and service in own:
            continue
        foreign[port] = sorted(owners)
    return foreign


def claim_port_block(
    local: Path | None = None, *, stop_own: Callable[[], object] | None = None
) -> PortBlock:
    """The block whose ports this checkout's services may use (see the module's text);
    records it. Called before the isolated services start; `stop_own` stops this checkout's
    services on the recorded block before they move."""
    local = local or local_dir()
    recorded = recorded_block(local)
    foreign = foreign_listeners(recorded, local)
    if not foreign:
        _record(local, recorded)
        return recorded
    holders = "; ".join(
        f"port {port}: " + (", ".join(describe_process(pid) for pid in pids) or "unknown")
        for port, pids in sorted(foreign.items())
    )
    if own_pids(local) and stop_own is not None:
        stop_own()
    listening = set(listening_sockets())
    for number in range(PORT_BLOCKS):
        candidate = PortBlock(number)
        if number == recorded.number or set(candidate.ports()) & listening:
            continue
        logger.warning(
            "The isolated services' ports of block %d are held by another owner (%s): this "
            "checkout's services (%s) move to block %d (PostgreSQL %d, Redis %d, Kafka %d-%d).",
            recorded.number,
            holders,
            local,
            number,
            candidate.postgres,
            candidate.redis,
            candidate.kafka(1),
            candidate.kafka(BROKERS),
        )
        # The brokers' data was formatted for the old quorum's ports: a new cluster starts.
        for node_dir in (local / "kafka").glob("node-*"):
            shutil.rmtree(node_dir, ignore_errors=True)
        _record(local, candidate)
        return candidate
    raise RuntimeError(
        f"Every block of ports for the isolated services is in use ({holders}); stop another "
        "checkout's isolated services with `manage.py scenario_services down` in its folder."
    )


def _record(local: Path, block: PortBlock) -> None:
    local.mkdir(parents=True, exist_ok=True)
    _block_file(local).write_text(f"{block.number}\n")
