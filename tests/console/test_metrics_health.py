"""/metrics reads the backlog from the database at scrape time; /health/ checks PostgreSQL,
Kafka, Redis, Celery workers and beat."""

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
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:1"
    import asyncio
    import datetime

    from console.health import Kafka

    check = Kafka(timeout=datetime.timedelta(seconds=1))
    result = asyncio.run(check.get_result())
    assert result.error is not None
    assert "Kafka unreachable" in str(result.error)
