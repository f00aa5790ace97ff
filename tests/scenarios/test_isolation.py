"""A scenario acts only on the isolated services its own checkout started. Another checkout's
services left running on the ports a checkout would use (a `make scenarios` elsewhere on the
same machine) are detected by their pids, left alone, and the checkout moves to free ports."""

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from scenarios import faults, ports
from scenarios.runner import STOP_TIMEOUT_SECONDS
from tests.scenarios.conftest import SERVICES_SCRIPT, free_block, isolated_env
from tests.scenarios.limits import RUN_TIMEOUT_SECONDS, TEST_TIMEOUT_SECONDS

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(TEST_TIMEOUT_SECONDS)]


@pytest.fixture
def other_checkout(tmp_path: Path) -> Iterator[tuple[Path, ports.PortBlock, int]]:
    """Another checkout's isolated Redis, started by services.sh from that checkout's folder
    on the Redis port of a free block, as `make scenarios` there would leave it."""
    folder = tmp_path / "other-checkout" / ".local" / "scenarios"
    block = free_block(besides=(ports.recorded_block().number,))
    env = {
        **os.environ,
        "LOCAL_DIR": str(folder),
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{block.redis}/0",
    }
    subprocess.run([SERVICES_SCRIPT, "redis-start"], env=env, check=True, capture_output=True)
    pid = int((folder / "redis" / "redis.pid").read_text())
    yield folder, block, pid
    subprocess.run([SERVICES_SCRIPT, "redis-stop"], env=env, check=True, capture_output=True)


def test_the_running_isolated_services_are_this_checkouts_own(isolated_services):
    block = ports.recorded_block()
    assert ports.foreign_listeners(block) == {}
    own = ports.own_pids()
    assert set(own) == {
        "postgres",
        "pgbouncer session",
        "pgbouncer transaction",
        "redis",
        "kafka node 1",
        "kafka node 2",
        "kafka node 3",
    }
    # Each port the faults aim at is served by the pid the faults would signal; the standby's
    # runs only while a failover scenario does.
    listeners = ports.listener_pids(set(block.ports()))
    for port, service in block.ports().items():
        if service != "postgres standby":
            assert own[service] in listeners[port], (port, service)
    assert ports.claim_port_block() == block


def test_ports_held_by_another_checkout_are_left_to_it(other_checkout, tmp_path, caplog):
    other, taken, other_pid = other_checkout
    fresh = tmp_path / "fresh-checkout" / ".local" / "scenarios"
    fresh.mkdir(parents=True)
    (fresh / "port-block").write_text(f"{taken.number}\n")

    assert ports.foreign_listeners(taken, fresh) == {taken.redis: [other_pid]}
    with caplog.at_level(logging.WARNING, logger="scenarios.ports"):
        claimed = ports.claim_port_block(fresh)

    assert claimed != taken
    assert ports.recorded_block(fresh) == claimed
    assert not set(claimed.ports()) & set(ports.listening_sockets())
    # The warning names the process and the folder that hold the ports.
    assert f"pid {other_pid}" in caplog.text
    assert str(other) in caplog.text
    assert ports.alive(other_pid)  # the other checkout's Redis still runs


def test_a_fresh_checkout_runs_its_scenario_beside_another_checkouts_services(
    other_checkout, tmp_path
):
    """The case that failed CI: another folder's services answer on the ports this checkout
    would use. The run moves to free ports, passes, and stops the services it started."""
    other, taken, other_pid = other_checkout
    fresh = tmp_path / "fresh-checkout" / ".local" / "scenarios"
    (fresh / "kafka").mkdir(parents=True)
    (fresh / "port-block").write_text(f"{taken.number}\n")
    # The Kafka jars, as `services.sh up` would fetch them: the same files, fetched once.
    (fresh / "kafka" / "libs").symlink_to(ports.local_dir() / "kafka" / "libs")
    result_file = tmp_path / "baseline.json"
    env = isolated_env()
    for name in faults.isolated_environment():
        env.pop(name, None)  # the run derives them from its own folder's ports
    env[ports.LOCAL_DIR_VARIABLE] = str(fresh)
    command = ["manage.py", "scenario_run", "baseline", "--events", "500"]
    process = subprocess.run(
        [sys.executable, *command, "--json", str(result_file)],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS + 10 * STOP_TIMEOUT_SECONDS,
        check=False,
    )
    output = process.stdout + process.stderr
    assert process.returncode == 0, output
    result = json.loads(result_file.read_text())[0]
    assert result["passed"], output
    moved_to = ports.recorded_block(fresh)
    assert moved_to != taken
    assert f"move to block {moved_to.number}" in output
    assert str(other) in output
    # It stopped what it started, and never touched the other checkout's Redis.
    assert ports.own_pids(fresh) == {}
    assert ports.alive(other_pid)
