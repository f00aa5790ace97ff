"""outbox/checks.py, and the shape of OUTBOX and KAFKA_EVENTS it registers checks of."""

import os
import subprocess
import sys

from django.conf import settings
from django.core.checks import run_checks

from outbox.checks import check_outbox_settings
from outbox.producer import producer_config


def ids() -> list[str]:
    return [message.id or "" for message in check_outbox_settings()]


def test_a_relay_interval_beat_cannot_store_is_an_error(settings):
    for interval in (0.5, 1.5, 0):
        settings.OUTBOX = {**settings.OUTBOX, "RELAY_INTERVAL": interval}
        assert ids() == ["outbox.E005"]
    settings.OUTBOX = {**settings.OUTBOX, "RELAY_INTERVAL": 2.0}
    assert check_outbox_settings(None) == []


def test_producer_properties_the_relay_sets_itself_are_errors_naming_what_to_set(settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_CONFIG": {
            "delivery.timeout.ms": 120_000,
            "acks": "1",
            "transactional.id": "mine",
            "message.max.bytes": "4000",  # the relay does not set it: any value goes
        },
    }
    assert [(m.id, m.msg, m.hint) for m in check_outbox_settings()] == [
        (
            "outbox.E007",
            'OUTBOX["PRODUCER_CONFIG"] sets "delivery.timeout.ms", which the relay sets itself.',
            'Remove it and set OUTBOX["PRODUCER_DELIVERY_TIMEOUT_MS"].',
        ),
        (
            "outbox.E007",
            'OUTBOX["PRODUCER_CONFIG"] sets "acks", which the relay sets itself.',
            "Remove it: the outbox fixes it (an idempotent producer, acks=all, at most 5 "
            "requests in flight).",
        ),
        (
            "outbox.E007",
            'OUTBOX["PRODUCER_CONFIG"] sets "transactional.id", which the relay sets itself.',
            'Remove it and set OUTBOX["RELAY_TRANSACTIONAL"] and '
            'OUTBOX["TRANSACTIONAL_ID_PREFIX"]: each relay slot gets its own id.',
        ),
    ]
    for key in ("message.timeout.ms", "transaction.timeout.ms", "enable.idempotence"):
        settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {key: 1}}
        assert ids() == ["outbox.E007"]


def test_the_producer_keeps_its_own_delivery_timeout_whatever_producer_config_says(settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "PRODUCER_DELIVERY_TIMEOUT_MS": 1000,
        "PRODUCER_CONFIG": {
            "message.timeout.ms": 60_000,
            "delivery.timeout.ms": 60_000,
            "transaction.timeout.ms": 900_000,
            "transactional.id": "shared",
            "max.in.flight": 100,
            "message.max.bytes": 4000,
        },
    }

    config = producer_config(transactional_id="outbox-relay-a@host-1")

    assert config["message.timeout.ms"] == 1000
    assert "delivery.timeout.ms" not in config
    assert "max.in.flight" not in config
    assert config["max.in.flight.requests.per.connection"] == 5
    assert config["transactional.id"] == "outbox-relay-a@host-1"
    assert config["transaction.timeout.ms"] == 60_000
    assert config["message.max.bytes"] == 4000
    assert "transactional.id" not in producer_config()


def test_a_partitioner_that_ignores_the_key_is_an_error_and_the_producer_leaves_it_out(
    settings,
):
    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {"partitioner": "random"}}
    assert ids() == ["outbox.E008"]
    assert "partitioner" not in producer_config()
    # Java producers' placement of keys is allowed: each key still goes to one partition.
    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {"partitioner": "murmur2_random"}}
    assert ids() == []
    assert producer_config()["partitioner"] == "murmur2_random"


def test_stale_relay_ticks_expire_instead_of_piling_up(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["outbox-relay"]
    assert entry["options"]["expires"] >= 3 * entry["schedule"]


def test_counts_below_one_are_errors_naming_the_key(settings):
    settings.OUTBOX = {
        "MAX_ATTEMPTS": 0,
        "BATCH_SIZE": 0,
        "MAX_PAYLOAD_BYTES": 0,
        "BATCH_MAX_BYTES": 0,
    }
    assert [(m.id, m.msg) for m in check_outbox_settings()] == [
        ("outbox.E002", 'OUTBOX["MAX_ATTEMPTS"] must be at least 1.'),
        ("outbox.E003", 'OUTBOX["BATCH_SIZE"] must be at least 1.'),
        ("outbox.E004", 'OUTBOX["MAX_PAYLOAD_BYTES"] must be at least 1.'),
        ("outbox.E009", 'OUTBOX["BATCH_MAX_BYTES"] must be at least 1.'),
    ]


def test_a_misspelt_key_and_a_mistyped_value_are_errors_naming_the_key(settings):
    settings.OUTBOX = {"BATCH_SIZ": 5, "MAX_ATTEMPTS": "3"}
    assert [(m.id, m.msg) for m in check_outbox_settings()] == [
        (
            "outbox.E010",
            'OUTBOX["BATCH_SIZ"]: not a setting of the outbox; did you mean "BATCH_SIZE"?',
        ),
        ("outbox.E011", """OUTBOX["MAX_ATTEMPTS"]: must be an integer; got '3' (str)."""),
    ]


def test_the_kafka_connection_is_checked_once_though_both_apps_register_it(settings):
    settings.KAFKA_EVENTS = {"BOOTSTRAP_SERVER": "kafka-1:9092"}
    messages = [m for m in run_checks() if m.id and m.id.startswith("kafka_events.")]
    assert [(m.id, m.msg) for m in messages] == [
        (
            "kafka_events.E010",
            'KAFKA_EVENTS["BOOTSTRAP_SERVER"]: not a setting of the Kafka connection; did you '
            'mean "BOOTSTRAP_SERVERS"?',
        )
    ]


def test_nudges_without_a_redis_to_count_them_in_are_a_warning(settings):
    settings.OUTBOX = {"NUDGE_ON_COMMIT": True}
    settings.CELERY_BROKER_URL = "amqp://guest@127.0.0.1//"
    assert ids() == ["outbox.W001"]
    settings.OUTBOX = {"NUDGE_ON_COMMIT": True, "NUDGE_REDIS_URL": "redis://127.0.0.1:6379/1"}
    assert ids() == []
    settings.OUTBOX = {"NUDGE_ON_COMMIT": True, "NUDGE_MIN_INTERVAL_MS": 0}
    assert ids() == []  # nothing to count
    settings.OUTBOX = {"NUDGE_ON_COMMIT": False}
    assert ids() == []
    del settings.CELERY_BROKER_URL
    settings.OUTBOX = {"NUDGE_ON_COMMIT": True}
    assert ids() == ["outbox.W001"]


def test_a_nudge_redis_url_that_is_not_redis_is_an_error(settings):
    settings.OUTBOX = {"NUDGE_REDIS_URL": "amqp://127.0.0.1//"}
    assert ids() == ["outbox.E006"]


def test_manage_py_check_stops_on_a_misspelt_key(tmp_path):
    (tmp_path / "misspelt_settings.py").write_text(
        'from project.settings.test import *  # noqa: F403\nOUTBOX = {"BATCH_SIZ": 5}\n'
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "misspelt_settings",
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{settings.BASE_DIR}",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert (
        '(outbox.E010) OUTBOX["BATCH_SIZ"]: not a setting of the outbox; did you mean '
        '"BATCH_SIZE"?' in result.stderr
    )
