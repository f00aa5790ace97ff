"""kafka_events/conf.py: an app's settings dict read through one object, with a default for
every key, following setting_changed, and checked for unknown keys and wrong types."""

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from inbox.conf import inbox_settings
from kafka_events.conf import AppSettings, kafka_settings
from kafka_events.kafka import kafka_connection_config
from outbox.conf import outbox_settings
from tests.conftest import drop_test_database

DEFAULTS = {
    "BATCH_SIZE": 100,
    "TIMEOUT_SECONDS": 1.5,
    "ENABLED": True,
    "NAME": "default",
    "CONFIG": {},
    "GROUPS": [],
    "URL": None,
}


def make_settings(**options) -> AppSettings:
    return AppSettings(
        "CONF_TEST",
        DEFAULTS,
        check_id="conf_test",
        label="the test app",
        **{"types": {"URL": str}, **options},
    )


def test_the_defaults_apply_when_the_project_has_no_dict():
    assert not hasattr(settings, "CONF_TEST")
    conf = make_settings()
    assert (conf.BATCH_SIZE, conf.TIMEOUT_SECONDS, conf.URL) == (100, 1.5, None)
    assert conf.check() == []


def test_a_value_of_the_project_wins_and_the_other_keys_keep_their_default(settings):
    settings.CONF_TEST = {"BATCH_SIZE": 7}
    conf = make_settings()
    assert (conf.BATCH_SIZE, conf.NAME) == (7, "default")


def test_a_change_through_the_settings_fixture_is_seen_at_once(settings):
    settings.KAFKA_EVENTS = {"BOOTSTRAP_SERVERS": "kafka-1:9092"}
    assert kafka_settings.BOOTSTRAP_SERVERS == "kafka-1:9092"  # read, and kept
    settings.KAFKA_EVENTS = {"BOOTSTRAP_SERVERS": "kafka-2:9092"}
    assert kafka_settings.BOOTSTRAP_SERVERS == "kafka-2:9092"
    assert kafka_connection_config() == {"bootstrap.servers": "kafka-2:9092"}
    settings.KAFKA_EVENTS = {}
    assert kafka_settings.BOOTSTRAP_SERVERS == "127.0.0.1:9092"


def test_the_end_of_an_override_is_seen_too():
    assert outbox_settings.BATCH_SIZE == 1000
    with override_settings(OUTBOX={**settings.OUTBOX, "BATCH_SIZE": 7}):
        assert outbox_settings.BATCH_SIZE == 7
    assert outbox_settings.BATCH_SIZE == 1000


def test_a_key_that_is_no_setting_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="'BATCH_SIZ' is not a setting of the outbox"):
        outbox_settings.BATCH_SIZ  # noqa: B018


def test_a_derived_default_follows_its_source_unless_set(settings):
    settings.INBOX = {}
    assert inbox_settings.BATCH_MAX_SECONDS == 100.0  # a third of 300,000 ms
    settings.INBOX = {"MAX_POLL_INTERVAL_MS": 60_000}
    assert inbox_settings.BATCH_MAX_SECONDS == 20.0
    settings.INBOX = {"MAX_POLL_INTERVAL_MS": 60_000, "BATCH_MAX_SECONDS": 5}
    assert inbox_settings.BATCH_MAX_SECONDS == 5
    settings.INBOX = {"MAX_POLL_INTERVAL_MS": 60_000, "BATCH_MAX_SECONDS": None}
    assert inbox_settings.BATCH_MAX_SECONDS == 20.0


def messages(conf: AppSettings) -> list[tuple[str, str]]:
    return [(message.id or "", message.msg) for message in conf.check()]


def test_an_unknown_key_is_an_error_naming_it_and_the_key_it_resembles(settings):
    settings.CONF_TEST = {"BATCH_SIZ": 5, "COLOUR": "red"}
    assert messages(make_settings()) == [
        (
            "conf_test.E010",
            'CONF_TEST["BATCH_SIZ"]: not a setting of the test app; did you mean "BATCH_SIZE"?',
        ),
        ("conf_test.E010", 'CONF_TEST["COLOUR"]: not a setting of the test app.'),
    ]


@pytest.mark.parametrize(
    ("key", "value", "wanted"),
    [
        ("BATCH_SIZE", "100", "an integer"),
        ("BATCH_SIZE", 1.5, "an integer"),
        ("BATCH_SIZE", True, "an integer"),  # an int to Python, never a count
        ("TIMEOUT_SECONDS", "1.5", "a number"),
        ("ENABLED", 1, "True or False"),
        ("ENABLED", "false", "True or False"),
        ("NAME", None, "a string"),
        ("CONFIG", ["a=b"], "a dict"),
        ("GROUPS", "billing", "a list"),
        ("URL", 6379, "a string or None"),
    ],
)
def test_a_value_of_the_wrong_type_is_an_error_naming_the_key(settings, key, value, wanted):
    settings.CONF_TEST = {key: value}
    [(check_id, message)] = messages(make_settings())
    assert check_id == "conf_test.E011"
    assert (
        message == f'CONF_TEST["{key}"]: must be {wanted}; got {value!r} ({type(value).__name__}).'
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("TIMEOUT_SECONDS", 2),  # an int is a number
        ("GROUPS", ("billing",)),
        ("URL", None),
        ("URL", "redis://127.0.0.1:6379/0"),
        ("CONFIG", {"security.protocol": "SSL"}),
    ],
)
def test_values_of_the_right_type_pass(settings, key, value):
    settings.CONF_TEST = {key: value}
    assert messages(make_settings()) == []


def test_a_setting_that_is_not_a_dict_is_an_error(settings):
    settings.CONF_TEST = [("BATCH_SIZE", 5)]
    conf = make_settings()
    assert [check_id for check_id, _ in messages(conf)] == ["conf_test.E012"]
    assert conf.BATCH_SIZE == 100  # reading still answers: the check stops start-up


def test_a_derived_key_is_checked_against_its_type(settings):
    settings.INBOX = {"BATCH_MAX_SECONDS": "30"}
    assert [m.id for m in inbox_settings.check()] == ["inbox.E011"]
    settings.INBOX = {"BATCH_MAX_SECONDS": None}
    assert inbox_settings.check() == []


# A project with only the two apps and a database: no OUTBOX, INBOX, KAFKA_EVENTS, nor Celery.
MINIMAL_SETTINGS = """
from project.settings.test import DATABASES, SECRET_KEY
INSTALLED_APPS = ["outbox", "inbox"]
USE_TZ = True
"""

READ_DEFAULTS = """
import django
django.setup()
from inbox.conf import inbox_settings
from kafka_events.kafka import kafka_connection_config
from outbox.conf import outbox_settings
from outbox.services.nudge import nudge_redis_url
print(outbox_settings.BATCH_SIZE, outbox_settings.TOPIC_TEMPLATE, inbox_settings.ORDERING)
print(inbox_settings.BATCH_MAX_SECONDS, kafka_connection_config(), nudge_redis_url())
"""


def test_a_project_with_only_outbox_and_inbox_gets_the_defaults(tmp_path):
    (tmp_path / "minimal_settings.py").write_text(MINIMAL_SETTINGS)
    environment = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
        "DJANGO_SETTINGS_MODULE": "minimal_settings",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{settings.BASE_DIR}",
    }
    result = subprocess.run(
        [sys.executable, "-c", READ_DEFAULTS],
        cwd=settings.BASE_DIR,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "1000 outbox.event.{aggregate_type} key",
        "100.0 {'bootstrap.servers': '127.0.0.1:9092'} None",
    ]


# Django's auth and contenttypes (which the outbox's migrations depend on, as every project
# made by `django-admin startproject` has them) and the two; no DEFAULT_AUTO_FIELD, so
# Django's default, AutoField.
STARTPROJECT_SETTINGS = """
from project.settings.test import DATABASES, SECRET_KEY
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "outbox", "inbox"]
USE_TZ = True
"""


def test_a_project_that_adds_outbox_and_inbox_passes_the_checks_and_migrates(tmp_path):
    # The apps' ids stay 64-bit, as their migrations made them, whatever the project's default;
    # their migrations wait for the console's only where the console is installed.
    database = f"test_outbox_minimal_{uuid.uuid4().hex[:8]}"
    (tmp_path / "minimal_settings.py").write_text(
        STARTPROJECT_SETTINGS
        + f'DATABASES = {{"default": {{**DATABASES["default"], "NAME": "{database}"}}}}\n'
    )
    environment = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
        "DJANGO_SETTINGS_MODULE": "minimal_settings",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{settings.BASE_DIR}",
    }

    def manage(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *arguments],
            cwd=settings.BASE_DIR,
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )

    with server_connection() as server:
        server.execute(f'CREATE DATABASE "{database}"')
    try:
        checked = manage("check")
        output = checked.stdout + checked.stderr
        assert checked.returncode == 0, output
        # The one issue: no Redis to space nudges across processes (the project has no Celery).
        assert re.findall(r"\(([a-z_]+\.[EW]\d{3})\)", output) == ["outbox.W001"], output
        migrated = manage("migrate", "--noinput")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        assert "Applying outbox.0014_partitioned_event_log... OK" in migrated.stdout
        assert "Applying console." not in migrated.stdout
        unmade = manage("makemigrations", "--check", "--dry-run")
        assert unmade.returncode == 0, unmade.stdout + unmade.stderr
    finally:
        with server_connection() as server:
            drop_test_database(server, database)


@contextmanager
def server_connection() -> Iterator[psycopg.Connection]:
    """A connection to the PostgreSQL server of the tests' database, outside any transaction."""
    options = connection.settings_dict
    with psycopg.connect(
        host=options["HOST"],
        port=options["PORT"] or 5432,
        user=options["USER"],
        password=options["PASSWORD"],
        dbname="postgres",
        autocommit=True,
    ) as server:
        yield server
