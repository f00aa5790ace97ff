"""scripts/services.sh's Zipkin. `make test` starts it (TRACING=1) before pytest runs: these
tests talk to the real server, and start a second one of their own beside it."""

import http.client
import json
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from django.conf import settings

SERVICES_SCRIPT = str(Path(settings.BASE_DIR) / "scripts" / "services.sh")
ZIPKIN_PORT = int(os.environ.get("ZIPKIN_PORT", "9411"))
ZIPKIN_JAR = Path(settings.BASE_DIR) / ".local" / "zipkin" / "zipkin-server-3.6.1-exec.jar"
SCRIPT_TIMEOUT_SECONDS = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def services(*arguments: str, **environment: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SERVICES_SCRIPT, *arguments],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_SECONDS,
        check=False,
    )


def a_span(service: str) -> dict:
    return {
        "traceId": secrets.token_hex(16),
        "id": secrets.token_hex(8),
        "name": "services check",
        "kind": "PRODUCER",
        "timestamp": time.time_ns() // 1000,
        "duration": 1500,
        "localEndpoint": {"serviceName": service},
        "tags": {"messaging.system": "kafka"},
    }


def zipkin_request(
    port: int, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def post_and_read_back(port: int, span: dict) -> list[dict]:
    status, _ = zipkin_request(port, "POST", "/api/v2/spans", json.dumps([span]).encode())
    assert status == 202
    # The collector stores asynchronously: the trace appears within moments.
    deadline = time.monotonic() + 10
    while True:
        status, body = zipkin_request(port, "GET", f"/api/v2/trace/{span['traceId']}")
        if status != 404 or time.monotonic() >= deadline:
            assert status == 200, body
            return json.loads(body)
        time.sleep(0.2)


def test_the_zipkin_make_test_started_keeps_a_span():
    span = a_span("services-zipkin-test")
    [stored] = post_and_read_back(ZIPKIN_PORT, span)
    assert (stored["id"], stored["name"]) == (span["id"], span["name"])
    assert stored["localEndpoint"]["serviceName"] == "services-zipkin-test"


def test_status_reports_zipkin_running():
    result = services("status", TRACING="1")
    assert f"zipkin     running at http://127.0.0.1:{ZIPKIN_PORT}" in result.stdout, result


@pytest.fixture
def not_zipkin() -> Iterator[int]:
    """A port on which an HTTP server answers 404 to everything, /health included."""
    server = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_a_port_held_by_something_else_is_an_error(not_zipkin, tmp_path):
    result = services("zipkin-up", LOCAL_DIR=str(tmp_path), ZIPKIN_PORT=str(not_zipkin))
    assert result.returncode == 1
    assert f"something answers at 127.0.0.1:{not_zipkin}" in result.stderr
    assert not (tmp_path / "zipkin").exists()


def test_a_jar_that_differs_from_maven_centrals_sha1_is_refused(tmp_path):
    # A curl that gives the published checksum a value no download can have.
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "curl").write_text(
        "#!/bin/bash\n"
        'for a in "$@"; do [[ "$a" == *.sha1 ]] && { printf "%040d\\n" 0; exit 0; }; done\n'
        'while (($#)); do [[ "$1" == -o ]] && echo "not a jar" >"$2"; shift; done\n'
    )
    (shims / "curl").chmod(0o755)
    local = tmp_path / "local"
    result = services(
        "zipkin-up",
        LOCAL_DIR=str(local),
        ZIPKIN_PORT=str(free_port()),
        PATH=f"{shims}:{os.environ['PATH']}",
    )
    assert result.returncode == 1
    assert "Maven Central publishes 0000000000000000000000000000000000000000" in result.stderr
    assert list((local / "zipkin").iterdir()) == []


def test_a_second_zipkin_runs_beside_the_first_and_stops(tmp_path):
    (tmp_path / "zipkin").mkdir()
    if ZIPKIN_JAR.is_file():
        # The jar this checkout fetched, so that the test downloads nothing.
        (tmp_path / "zipkin" / ZIPKIN_JAR.name).symlink_to(ZIPKIN_JAR)
    # Otherwise (the Zipkin at ZIPKIN_PORT is another checkout's) the script fetches its own.
    environment = {"LOCAL_DIR": str(tmp_path), "ZIPKIN_PORT": str(free_port())}
    port = int(environment["ZIPKIN_PORT"])
    started = services("zipkin-up", **environment)
    try:
        assert started.returncode == 0, started.stderr
        pid = int((tmp_path / "zipkin" / "zipkin.pid").read_text())
        assert post_and_read_back(port, a_span("second-zipkin"))
        again = services("zipkin-up", **environment)
        assert f"running at http://127.0.0.1:{port} (pid {pid})" in again.stdout
    finally:
        stopped = services("zipkin-down", **environment)
    assert stopped.returncode == 0, stopped.stderr
    assert "zipkin     stopped" in stopped.stdout
    assert not Path(f"/proc/{pid}").exists()
    assert not (tmp_path / "zipkin" / "zipkin.pid").exists()
    # The first one is untouched.
    assert post_and_read_back(ZIPKIN_PORT, a_span("first-zipkin"))
