"""Celery beat's heartbeat: a real beat process with the console's scheduler writes it on its
ticks; the dashboard and /health/ read its age."""

import subprocess
import sys
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from console.beat import HEARTBEAT_KEY, beat_heartbeat_record, beat_last_tick
from console.selectors import GREEN, RED, _beat_health
from tests.outbox.conftest import subprocess_environment, wait_until

# A Redis database of these tests' own: a beat of `make run` writes its heartbeat in db 0.
HEARTBEAT_REDIS = "redis://127.0.0.1:6379/14"


@pytest.fixture
def heartbeat_redis(settings):
    settings.CELERY_BROKER_URL = HEARTBEAT_REDIS
    client = redis.Redis.from_url(HEARTBEAT_REDIS)
    client.delete(HEARTBEAT_KEY)
    yield client
    client.delete(HEARTBEAT_KEY)
    client.close()


def test_a_beat_process_writes_its_heartbeat_on_its_ticks(
    heartbeat_redis, transactional_db, tmp_path
):
    started = timezone.now()
    beat = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "project",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(tmp_path / "beat-schedule"),
        ],
        cwd=settings.BASE_DIR,
        env=subprocess_environment(CELERY_BROKER_URL=HEARTBEAT_REDIS),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: beat_last_tick() is not None, timeout=60, message="a heartbeat")
        first = beat_last_tick()
        assert first is not None
        assert first >= started - timedelta(seconds=1)
        # Written again on later ticks, not once at start.
        wait_until(lambda: (beat_last_tick() or first) > first, timeout=30, message="a later one")
        part = _beat_health(timezone.now())
        assert part.colour == GREEN, part
    finally:
        beat.terminate()
        output = beat.communicate(timeout=30)[0]
    assert "HeartbeatScheduler" in output or "console.beat" in output, output[-2000:]


def test_an_old_heartbeat_or_none_is_red_on_the_dashboard(heartbeat_redis):
    now = timezone.now()
    part = _beat_health(now)
    assert (part.colour, part.detail) == (RED, "no heartbeat: not running")
    stale = settings.CONSOLE_BEAT_STALE_SECONDS[1] + 30
    beat_heartbeat_record(time.time() - stale)
    part = _beat_health(timezone.now())
    assert part.colour == RED
    assert part.detail == f"last tick {stale:.0f} s ago"
    beat_heartbeat_record()
    assert _beat_health(timezone.now()).colour == GREEN


def test_health_reports_beat_by_its_heartbeat(heartbeat_redis):
    import asyncio

    from console.health import CeleryBeat

    missing = asyncio.run(CeleryBeat().get_result())
    assert "no heartbeat" in str(missing.error)
    beat_heartbeat_record()
    assert asyncio.run(CeleryBeat().get_result()).error is None
