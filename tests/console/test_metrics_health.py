"""/metrics reads the backlog from the database at scrape time; /health/ checks PostgreSQL,
Kafka, Redis, Celery workers and beat."""

import pytest
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

    from project.health import Kafka

    check = Kafka(timeout=datetime.timedelta(seconds=1))
    result = asyncio.run(check.get_result())
    assert result.error is not None
    assert "Kafka unreachable" in str(result.error)
