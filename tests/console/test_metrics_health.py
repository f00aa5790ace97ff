"""/metrics reads the backlog from the database at scrape time; /health/ checks PostgreSQL,
Kafka, Redis, Celery workers and beat."""

import asyncio
import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings
from django.test import Client

from outbox.models import OutboxEvent

pytestmark = pytest.mark.django_db


def test_metrics_expose_database_gauges(make_event):
    make_event(OutboxEvent.Status.FAILED)
    make_event(OutboxEvent.Status.PENDING)
    response = Client().get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    assert 'outbox_events{status="FAILED"} 1.0' in text
    assert 'outbox_events{status="PENDING"} 1.0' in text
    assert 'inbox_messages{status="DONE"} 0.0' in text
    assert "outbox_oldest_pending_age_seconds" in text
    assert "outbox_events_published_total" in text or "outbox_events_published" in text


COUNT_IN_ANOTHER_PROCESS = """
import django
django.setup()
from outbox import metrics
metrics.PUBLISHED.labels("orders").inc(3)
metrics.PUBLISH_LAG.observe(0.02)
"""


def test_metrics_sum_the_counters_of_every_process(tmp_path, monkeypatch, make_event):
    # The relay and the consumers count in processes other than the web's: with
    # PROMETHEUS_MULTIPROC_DIR, /metrics must show what they counted.
    environment = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "project.settings.test",
    }
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-c", COUNT_IN_ANOTHER_PROCESS],
            cwd=Path(settings.BASE_DIR),
            env=environment,
            check=True,
            timeout=60,
        )
    # Named by host and pid: containers sharing the directory repeat each other's pids.
    host = socket.gethostname().replace("_", "-")
    assert sorted(path.name.split("_")[0] for path in tmp_path.iterdir()) == [
        "counter",
        "counter",
        "histogram",
        "histogram",
    ]
    assert all(path.name.split("_", 1)[1].startswith(f"{host}-") for path in tmp_path.iterdir())
    make_event(OutboxEvent.Status.PENDING)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    text = Client().get("/metrics").content.decode()
    assert 'outbox_events_published_total{topic="orders"} 6.0' in text
    assert "outbox_publish_lag_seconds_count 2.0" in text
    assert 'outbox_events{status="PENDING"} 1.0' in text


def test_metrics_token(settings):
    settings.METRICS_TOKEN = "s3cret"
    assert Client().get("/metrics").status_code == 401
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert response.status_code == 200


@pytest.mark.kafka
def test_health_checks_every_part_and_reports_json():
    # No Celery worker and no beat run under pytest: those two report errors, the rest OK.
    response = Client().get("/health/", HTTP_ACCEPT="application/json")
    body = response.json()
    assert response.status_code == 500
    names = " ".join(body)
    for part in ("Database", "Kafka", "Redis", "Ping", "CeleryBeat"):
        assert part in names
    by_name = {name.split("(")[0]: value for name, value in body.items()}
    assert by_name["Database"] == "OK"
    assert by_name["Kafka"] == "OK"
    assert by_name["Redis"] == "OK"


def test_health_reports_an_unreachable_kafka(settings):
    settings.KAFKA_EVENTS = {**settings.KAFKA_EVENTS, "BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    import asyncio
    import datetime

    from console.health import Kafka

    check = Kafka(timeout=datetime.timedelta(seconds=1))
    result = asyncio.run(check.get_result())
    assert result.error is not None
    assert "Kafka unreachable" in str(result.error)


@pytest.mark.parametrize(
    ("path", "setting"), [("/metrics", "METRICS_TOKEN"), ("/health/", "HEALTH_TOKEN")]
)
def test_monitoring_is_closed_without_a_token_where_it_must_be(
    settings, monkeypatch, path, setting
):
    from console import health

    monkeypatch.setattr(health, "_health_answers", {})
    settings.MONITORING_OPEN_WITHOUT_TOKEN = False
    setattr(settings, setting, "")
    response = Client().get(path)
    assert response.status_code == 403
    assert f"set {setting}" in response.content.decode()
    setattr(settings, setting, "s3cret")
    assert Client().get(path).status_code == 401
    assert Client().get(path, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    # With the token, the endpoint answers (/health/ with 500 here: no Celery worker runs).
    answered = Client().get(path, HTTP_AUTHORIZATION="Bearer s3cret", HTTP_ACCEPT="text/plain")
    assert answered.status_code in (200, 500)
    assert "token" not in answered.content.decode().lower()


@pytest.mark.kafka
def test_health_answers_from_its_last_run_for_a_few_seconds(settings, monkeypatch):
    from console import health

    runs = []
    original = health.Kafka.run

    def counted(check):
        runs.append(check)
        return original(check)

    monkeypatch.setattr(health.Kafka, "run", counted)
    monkeypatch.setattr(health, "_health_answers", {})
    settings.HEALTH_CACHE_SECONDS = 60
    first = Client().get("/health/", HTTP_ACCEPT="application/json")
    second = Client().get("/health/", HTTP_ACCEPT="application/json")
    assert len(runs) == 1
    assert second.json() == first.json()
    assert "no-cache" in second["Cache-Control"]
    # Once the answer is older than that, the checks run again.
    for asked, answer in list(health._health_answers.items()):
        health._health_answers[asked] = dataclasses.replace(answer, until=0.0)
    Client().get("/health/", HTTP_ACCEPT="application/json")
    assert len(runs) == 2


@pytest.mark.kafka
def test_the_kafka_check_reuses_one_admin_client():
    import asyncio

    from console.health import Kafka, _kafka_admin_client

    _kafka_admin_client.cache_clear()
    for _ in range(3):
        assert asyncio.run(Kafka().get_result()).error is None
    assert _kafka_admin_client.cache_info().currsize == 1


class RestartableRedis:
    """A port that forwards to the real Redis and can stop (every connection closed, new ones
    refused) and start again on the same port: what a Redis restart looks like to a client."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._sockets: list[socket.socket] = []

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets.append(listener)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)


@pytest.fixture
def restartable_redis(settings):
    url = urlparse(settings.CELERY_BROKER_URL)
    redis_port = RestartableRedis((url.hostname or "127.0.0.1", url.port or 6379))
    redis_port.start()
    # A database no test writes: the checks only read it.
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{redis_port.port}/15"
    yield redis_port
    redis_port.stop()


def test_the_redis_checks_reuse_one_client_that_outlives_a_redis_restart(
    restartable_redis, monkeypatch
):
    import redis

    from console.beat import redis_client
    from console.health import CeleryBeat, Redis
    from console.selectors import RED, _redis_health

    used = []
    send = redis.Redis.execute_command

    def recorded(client, *args, **options):
        used.append(client)
        return send(client, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", recorded)

    def errors() -> list[str]:
        results = [asyncio.run(check().get_result()) for check in (Redis, CeleryBeat)]
        # The dashboard's Redis tile too.
        tile = _redis_health()
        return [str(result.error or "") for result in results] + [
            tile.detail if tile.colour != RED else "red"
        ]

    # Redis answers; beat, which no test runs, has no heartbeat there.
    up = ["", "Unavailable: Celery beat has no heartbeat: not running", "answers PING"]
    assert errors() == up
    assert errors() == up
    restartable_redis.stop()
    down = [
        "Unavailable: Redis unreachable",
        "Unavailable: Celery beat's heartbeat cannot be read",
        "red",
    ]
    assert errors() == down
    restartable_redis.start()
    assert errors() == up
    assert {id(client) for client in used} == {id(redis_client(settings.CELERY_BROKER_URL))}
