"""The scenarios run on their own set of services (scenarios/faults.py: other ports, another
data folder, three Kafka brokers): the session starts it and stops it at the end (a set that
was already running stays up). The default services, which the rest of the suite uses, are
never touched."""

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from scenarios import faults, ports
from tests.scenarios.limits import (
    RUN_TIMEOUT_SECONDS,
    SERVICES_DOWN_SECONDS,
    SERVICES_UP_SECONDS,
)

# Events per scenario in the test suite; the full sizes are `make scenarios`'.
TEST_EVENTS = int(os.environ.get("SCENARIO_TEST_EVENTS", "2000"))
SERVICES_SCRIPT = str(Path(settings.BASE_DIR) / "scripts" / "services.sh")


def free_block(*, besides: tuple[int, ...] = ()) -> ports.PortBlock:
    """A block on whose ports nothing listens now."""
    listening = set(ports.listening_sockets())
    for number in range(1, ports.PORT_BLOCKS):
        block = ports.PortBlock(number)
        if number not in besides and not set(block.ports()) & listening:
            return block
    raise AssertionError("no free block of ports on this machine")


@pytest.fixture(scope="session")
def isolated_services() -> Iterator[None]:
    # As scenario_run does: services that were already running (`--keep-services`) stay up.
    started_here = not faults.running()
    faults.services("up", timeout=SERVICES_UP_SECONDS)
    yield
    if started_here:
        faults.services("down", timeout=SERVICES_DOWN_SECONDS)


def isolated_env() -> dict[str, str]:
    env = {**os.environ, **faults.isolated_environment()}
    env["DJANGO_SETTINGS_MODULE"] = "project.settings.local"
    for name in ("TEST_DATABASE_NAME", "OUTBOX_FAULT_INJECTION", "INBOX_FAULT_INJECT"):
        env.pop(name, None)
    return env


@pytest.fixture
def scenario_run(
    isolated_services: None, tmp_path: Path
) -> Callable[..., tuple[int, str, dict[str, Any]]]:
    """Runs `manage.py scenario_run NAME --events N` in a subprocess; returns its exit code,
    its output and its JSON result."""

    def run(name: str, *, events: int = TEST_EVENTS) -> tuple[int, str, dict[str, Any]]:
        result_file = tmp_path / f"{name}.json"
        process = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "scenario_run",
                name,
                "--events",
                str(events),
                "--json",
                str(result_file),
            ],
            cwd=settings.BASE_DIR,
            env=isolated_env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_SECONDS,
            check=False,
        )
        output = process.stdout + process.stderr
        assert result_file.exists(), output
        return process.returncode, output, json.loads(result_file.read_text())[0]

    return run
