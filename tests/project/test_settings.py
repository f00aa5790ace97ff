import importlib
import os
import secrets
import subprocess
import sys

import pytest
from django.conf import settings
from django.test import override_settings

import project.settings.inbox
import project.settings.kafka
import project.settings.outbox
from inbox.conf import inbox_settings
from kafka_events.conf import kafka_settings
from outbox.conf import outbox_settings
from project.settings.environment import PRODUCTION_REQUIRED_VARIABLES, env_settings

PRODUCTION_ENVIRONMENT = {
    "DJANGO_SETTINGS_MODULE": "project.settings.production",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "DATABASE_URL": "postgres://outbox:secret@db.internal:5432/outbox",
    "KAFKA_BOOTSTRAP_SERVERS": "kafka-1.internal:9092,kafka-2.internal:9092",
    "ALLOWED_HOSTS": "events.example.com",
}


def manage(*arguments: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A clean environment: no variable of the test run leaks into the settings under test.
    base = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG")}
    return subprocess.run(
        [sys.executable, "manage.py", *arguments],
        cwd=settings.BASE_DIR,
        env={**base, **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_settings_pass_the_deploy_check():
    result = manage(
        "check", "--deploy", "--fail-level", "WARNING", environment=PRODUCTION_ENVIRONMENT
    )
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


@pytest.mark.parametrize("variable", PRODUCTION_REQUIRED_VARIABLES)
def test_production_start_up_names_a_missing_variable(variable):
    environment = {key: value for key, value in PRODUCTION_ENVIRONMENT.items() if key != variable}
    result = manage("check", environment=environment)
    assert result.returncode != 0
    assert f"Set the {variable} environment variable" in result.stderr


def test_development_defaults_need_no_environment():
    result = manage("check", environment={})
    assert result.returncode == 0, result.stderr


def test_production_closes_metrics_and_health_until_their_tokens_are_set():
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.MONITORING_OPEN_WITHOUT_TOKEN)",
        environment=PRODUCTION_ENVIRONMENT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("days", ["0", "366"])
def test_an_api_token_lifetime_beyond_a_year_stops_start_up(days):
    result = manage("check", environment={"API_TOKEN_TTL_DAYS": days})
    assert result.returncode != 0
    assert f"API_TOKEN_TTL_DAYS is {days}; a token lives 1 to 365 days." in result.stderr


def test_env_settings_holds_only_the_keys_whose_variable_is_set(monkeypatch):
    monkeypatch.setenv("CONF_TEST_BATCH_SIZE", "7")
    monkeypatch.setenv("CONF_TEST_CONFIG", "security.protocol=SSL,acks=all")
    monkeypatch.setenv("CONF_TEST_ENABLED", "false")
    monkeypatch.delenv("CONF_TEST_NAME", raising=False)
    types = {"BATCH_SIZE": int, "CONFIG": dict, "ENABLED": bool, "NAME": str}
    assert env_settings("CONF_TEST_", types) == {
        "BATCH_SIZE": 7,
        "CONFIG": {"security.protocol": "SSL", "acks": "all"},
        "ENABLED": False,
    }


# A value of each type as a variable gives it.
VARIABLE_VALUES = {int: "7", float: "2.5", bool: "false", str: "x", dict: "a=b", list: "a,b"}


@pytest.mark.parametrize(
    ("module", "prefix", "conf"),
    [
        (project.settings.outbox, "OUTBOX_", outbox_settings),
        (project.settings.inbox, "INBOX_", inbox_settings),
        (project.settings.kafka, "KAFKA_", kafka_settings),
    ],
    ids=["OUTBOX", "INBOX", "KAFKA_EVENTS"],
)
def test_every_key_of_an_app_is_read_from_its_variable_as_the_app_wants_it(
    module, prefix, conf, monkeypatch
):
    for key, kind in conf.types.items():
        monkeypatch.setenv(prefix + key, VARIABLE_VALUES[kind])
    try:
        read = getattr(importlib.reload(module), conf.setting_name)
        assert sorted(read) == sorted(conf.defaults)
        with override_settings(**{conf.setting_name: read}):
            assert conf.check() == []
    finally:
        monkeypatch.undo()
        importlib.reload(module)


def test_the_beat_schedule_falls_back_on_the_apps_defaults():
    # The dicts leave the intervals out: outbox/beat.py and inbox/beat.py take the defaults.
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert "RELAY_INTERVAL" not in settings.OUTBOX
    assert "RETRY_INTERVAL" not in settings.INBOX
    assert schedule["outbox-relay"]["schedule"] == outbox_settings.RELAY_INTERVAL
    assert schedule["inbox-retry-due"]["schedule"] == inbox_settings.RETRY_INTERVAL


def test_the_apps_dicts_come_from_the_variables_of_the_same_names():
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings; "
        "print(settings.OUTBOX, settings.INBOX, settings.KAFKA_EVENTS, "
        "settings.CELERY_BEAT_SCHEDULE['outbox-relay']['schedule'])",
        environment={
            "OUTBOX_BATCH_SIZE": "50",
            "OUTBOX_RELAY_INTERVAL": "3",
            "INBOX_EXACTLY_ONCE_GROUPS": "billing,shipping",
            "KAFKA_CLIENT_CONFIG": "security.protocol=SSL",
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == (
        "{'RELAY_INTERVAL': 3.0, 'BATCH_SIZE': 50} "
        "{'EXACTLY_ONCE_GROUPS': ['billing', 'shipping']} "
        "{'CLIENT_CONFIG': {'security.protocol': 'SSL'}} 3.0"
    )


@pytest.mark.django_db
def test_the_database_sessions_run_without_jit():
    # The console's queries are costed past the JIT threshold; compiling them took longer than
    # running them (project/settings/database.py).
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("off",)


def test_production_sessions_run_without_jit_unless_the_url_says_otherwise():
    script = (
        "from django.conf import settings; "
        "print(settings.DATABASES['default']['OPTIONS']['options'])"
    )
    default = manage("shell", "-c", script, environment=PRODUCTION_ENVIRONMENT)
    assert default.returncode == 0, default.stderr
    assert default.stdout.strip().splitlines()[-1] == "-c jit=off"
    own = {
        **PRODUCTION_ENVIRONMENT,
        "DATABASE_URL": PRODUCTION_ENVIRONMENT["DATABASE_URL"] + "?options=-c%20jit%3Don",
    }
    chosen = manage("shell", "-c", script, environment=own)
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.strip().splitlines()[-1] == "-c jit=on"
