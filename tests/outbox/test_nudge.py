import pytest
import redis
from django.db import transaction

import outbox
from outbox.services.nudge import relay_nudge_key
from outbox.services.publish import outbox_event_publish

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = {
    "aggregate_type": "payment",
    "aggregate_id": "p-1",
    "event_type": "PaymentCompleted",
    "payload": {"amount": "10.00"},
}


def test_the_relay_is_nudged_once_per_committed_transaction(settings, monkeypatch):
    settings.OUTBOX = {**settings.OUTBOX, "NUDGE_ON_COMMIT": True, "NUDGE_MIN_INTERVAL_MS": 0}
    sent = []
    monkeypatch.setattr("outbox.tasks.relay.apply_async", lambda **kwargs: sent.append(kwargs))
    with transaction.atomic():
        for number in range(3):
            outbox_event_publish(**{**EVENT, "aggregate_id": f"p-{number}"})
        assert sent == []  # nothing before the commit
    assert len(sent) == 1
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.publish(**EVENT)
        raise RuntimeError
    assert len(sent) == 1  # a rolled-back transaction nudges nobody


@pytest.fixture
def shared_nudge_slot(settings):
    """The Redis key that spaces nudges across processes, free before and after the test."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(relay_nudge_key())
    yield client
    client.delete(relay_nudge_key())


def test_nudges_are_spaced_by_the_minimum_interval(settings, monkeypatch, shared_nudge_slot):
    settings.OUTBOX = {**settings.OUTBOX, "NUDGE_ON_COMMIT": True, "NUDGE_MIN_INTERVAL_MS": 60_000}
    monkeypatch.setattr("outbox.services.nudge._last_nudge_at", 0.0)
    sent = []
    monkeypatch.setattr("outbox.tasks.relay.apply_async", lambda **kwargs: sent.append(kwargs))
    for _ in range(3):
        with transaction.atomic():
            outbox.publish(**EVENT)
    assert len(sent) == 1


def test_nudges_are_spaced_across_processes(settings, monkeypatch, shared_nudge_slot):
    settings.OUTBOX = {**settings.OUTBOX, "NUDGE_ON_COMMIT": True, "NUDGE_MIN_INTERVAL_MS": 60_000}
    sent = []
    monkeypatch.setattr("outbox.tasks.relay.apply_async", lambda **kwargs: sent.append(kwargs))
    for process in range(3):
        # Each round is another web process: its own spacing has never nudged.
        monkeypatch.setattr("outbox.services.nudge._last_nudge_at", 0.0)
        with transaction.atomic():
            outbox.publish(**{**EVENT, "aggregate_id": f"p-{process}"})
    assert len(sent) == 1
    assert 0 < shared_nudge_slot.pttl(relay_nudge_key()) <= 60_000

    shared_nudge_slot.delete(relay_nudge_key())  # the interval has passed
    monkeypatch.setattr("outbox.services.nudge._last_nudge_at", 0.0)
    with transaction.atomic():
        outbox.publish(**{**EVENT, "aggregate_id": "p-late"})
    assert len(sent) == 2


def test_without_a_redis_the_nudges_are_spaced_per_process_only(settings, monkeypatch):
    # A project whose Celery broker is not Redis, or that sets no CELERY_BROKER_URL at all.
    del settings.CELERY_BROKER_URL
    settings.OUTBOX = {**settings.OUTBOX, "NUDGE_ON_COMMIT": True, "NUDGE_MIN_INTERVAL_MS": 60_000}
    sent = []
    monkeypatch.setattr("outbox.tasks.relay.apply_async", lambda **kwargs: sent.append(kwargs))
    for process in range(2):
        monkeypatch.setattr("outbox.services.nudge._last_nudge_at", 0.0)  # another process
        for _ in range(2):
            with transaction.atomic():
                outbox.publish(**{**EVENT, "aggregate_id": f"p-{process}"})
    assert len(sent) == 2


def test_the_nudge_redis_url_counts_nudges_when_the_broker_is_not_redis(
    settings, monkeypatch, shared_nudge_slot
):
    redis_url = settings.CELERY_BROKER_URL  # the Redis of shared_nudge_slot
    settings.CELERY_BROKER_URL = "amqp://guest@127.0.0.1//"
    settings.OUTBOX = {
        **settings.OUTBOX,
        "NUDGE_ON_COMMIT": True,
        "NUDGE_MIN_INTERVAL_MS": 60_000,
        "NUDGE_REDIS_URL": redis_url,
    }
    sent = []
    monkeypatch.setattr("outbox.tasks.relay.apply_async", lambda **kwargs: sent.append(kwargs))
    for process in range(2):
        monkeypatch.setattr("outbox.services.nudge._last_nudge_at", 0.0)
        with transaction.atomic():
            outbox.publish(**{**EVENT, "aggregate_id": f"p-{process}"})
    assert len(sent) == 1
    assert 0 < shared_nudge_slot.pttl(relay_nudge_key()) <= 60_000
