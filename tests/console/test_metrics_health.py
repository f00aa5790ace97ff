"""/metrics reads the backlog from the database at scrape time; /health/ checks PostgreSQL,
Kafka, Redis, Celery workers and beat."""

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

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
