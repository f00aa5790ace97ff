"""Installed as a user installs it: the wheel built from this checkout goes into a new
virtualenv beside a project `django-admin startproject shop` just made, and the code blocks of
README.md's "Use it in your project" run there word for word, in order: the project migrates
on PostgreSQL, publishes in a transaction, the relay delivers to Kafka and a consumer's
@handler has its effect exactly once, though Kafka delivers the record twice. The same
project's `check --deploy` is clean with production settings. On the Django LTS this
repository pins, on the newest Django and on Django 6.0 (both need Python 3.12 or later)."""

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from django.conf import settings
from django.db import connection

from kafka_events.kafka import kafka_connection_config
from tests.conftest import connect_outside_django, drop_test_database
from tests.distribution import build_distributions
from tests.kafka_events.test_conf import server_connection

README = Path(settings.BASE_DIR) / "README.md"
SECTION = "## Use it in your project"
COMMAND_TIMEOUT_SECONDS = 300
EFFECT_TIMEOUT_SECONDS = 90
STOP_TIMEOUT_SECONDS = 30
KAFKA_TIMEOUT_SECONDS = 15

# The README's names that each run replaces with names of its own, so that runs share no
# database, topic or consumer group.
README_TOPIC = "shop.orders"
README_GROUP_OPTIONS = ('group="shipping"', "--group shipping")
# A block starting with this line is a shell command that serves until stopped.
LONG_RUNNING = "# runs until stopped"
# A Python block starting with this line is typed into `python manage.py shell`.
SHELL = "# python manage.py shell"

# (interpreter, Django), one run each: the LTS of requirements.txt on this repository's
# Python, the newest Django on Python 3.12, and Django 6.0 (the release between them that
# pyproject.toml's range admits) on Python 3.13. CI runs on this machine: a missing
# interpreter is a failure, never a skip.
PYTHON_3_11 = os.environ.get("INSTALL_TEST_PYTHON_3_11", "/usr/bin/python3.11")
PYTHON_3_12 = os.environ.get(
    "INSTALL_TEST_PYTHON_3_12", "/root/.pyenv/versions/3.12.1/bin/python3.12"
)
PYTHON_3_13 = os.environ.get(
    "INSTALL_TEST_PYTHON_3_13", "/root/.pyenv/versions/3.13.0/bin/python3.13"
)
DJANGO_LTS = "Django==5.2.19"
DJANGO_NEWEST = "Django==6.1.3"
DJANGO_6_0 = "Django==6.0.10"


@dataclass(frozen=True)
class Block:
    language: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0]


def readme_blocks() -> list[Block]:
    """The fenced code blocks of the README's section, in order."""
    readme = README.read_text()
    assert SECTION in readme, f"README.md has no section {SECTION!r}"
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [
        Block(language, text)
        for language, text in re.findall(r"^```(\w+)\n(.*?)^```", section, re.M | re.S)
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_distributions(
        workspace=tmp_path_factory.mktemp("checkout"), output=tmp_path_factory.mktemp("dist")
    )["wheel"]


@pytest.fixture
def database() -> Iterator[str]:
    name = f"test_install_{uuid.uuid4().hex[:8]}"
    with server_connection() as server:
        server.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with server_connection() as server:
            drop_test_database(server, name)


@pytest.fixture
def topic() -> Iterator[str]:
    # Made before the consumer subscribes, as an operator makes a service's topics.
    from confluent_kafka.admin import NewTopic

    name = f"test.install.{uuid.uuid4().hex[:10]}"
    admin = AdminClient(kafka_connection_config())
    admin.create_topics([NewTopic(name, num_partitions=1)])[name].result(KAFKA_TIMEOUT_SECONDS)
    yield name
    admin.delete_topics([name])[name].result(KAFKA_TIMEOUT_SECONDS)


class Shop:
    """The project: a virtualenv, the directory of its manage.py, and the processes started."""

    def __init__(self, root: Path, python: str, database: str, topic: str, group: str) -> None:
        self.venv = root / "venv"
        self.directory = root / "shop"
        self.database = database
        self.topic = topic
        self.group = group
        self.processes: list[tuple[subprocess.Popen[str], Path]] = []
        self.environment = {
            **{key: value for key, value in os.environ.items() if key in ("HOME", "LANG")},
            "PATH": f"{self.venv / 'bin'}{os.pathsep}/usr/bin:/bin",
            "VIRTUAL_ENV": str(self.venv),
            # The README's settings with this run's database (install_settings.py).
            "DJANGO_SETTINGS_MODULE": "shop.install_settings",
        }
        if not Path(python).exists():
            pytest.fail(
                f"The install test needs the interpreter {python}; install it (pyenv install) "
                "or name another in INSTALL_TEST_PYTHON_3_11, _3_12 or _3_13."
            )
        self.run(python, "-m", "venv", str(self.venv), cwd=root)

    def run(
        self, *command: str, cwd: Path | None = None, stdin: str | None = None, **env: str
    ) -> str:
        result = subprocess.run(
            command,
            cwd=cwd or self.directory,
            env={**self.environment, **env},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
        )
        assert result.returncode == 0, (
            f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
        return result.stdout + result.stderr

    def localise(self, text: str) -> str:
        text = text.replace(README_TOPIC, self.topic)
        for option in README_GROUP_OPTIONS:
            text = text.replace(option, option.replace("shipping", self.group))
        return text

    def follow(self, block: Block) -> None:
        text = self.localise(block.text)
        if block.language == "python" and block.first_line == SHELL:
            self.run("python", "manage.py", "shell", stdin=text)
        elif block.language == "python" and re.fullmatch(r"# [\w/]+\.py", block.first_line):
            with (self.directory / block.first_line[2:]).open("a") as module:
                module.write("\n" + text)
        elif block.language == "sh" and block.first_line == LONG_RUNNING:
            [command] = text.splitlines()[1:]
            self.start(command)
        elif block.language == "sh":
            for command in text.splitlines():
                self.run("bash", "-c", command)
        else:
            pytest.fail(f"The install test cannot follow this README block:\n{block.text}")

    def start(self, command: str) -> None:
        log = self.directory / f"process-{len(self.processes)}.log"
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.directory,
            env=self.environment,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.processes.append((process, log))

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in self.processes)

    def stop(self) -> None:
        for process, _ in self.processes:
            process.send_signal(signal.SIGTERM)
        for process, _ in self.processes:
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def query(self, sql: str, *params: Any) -> Any:
        with connect_outside_django(
            {**connection.settings_dict, "NAME": self.database}
        ) as database:
            return database.execute(sql, params).fetchone()[0]  # type: ignore[index]


def settings_module(*, database: str, production: bool) -> str:
    options = connection.settings_dict
    module = (
        "from shop.settings import *  # noqa: F403 (the README's settings)\n"
        f"DATABASES['default'].update(NAME={database!r}, USER={options['USER']!r}, "
        f"PASSWORD={options['PASSWORD']!r}, HOST={options['HOST']!r}, "
        f"PORT={options['PORT'] or 5432!r})\n"
    )
    if not production:
        # No Celery worker runs here (the relay is outbox_relay): no nudge goes to a broker
        # queue that nothing reads.
        return module + "OUTBOX['NUDGE_ON_COMMIT'] = False\n"
    return module + (
        "DEBUG = False\n"
        f"SECRET_KEY = {secrets.token_urlsafe(50)!r}\n"
        "ALLOWED_HOSTS = ['shop.example.com']\n"
        "SECURE_SSL_REDIRECT = True\n"
        "SECURE_HSTS_SECONDS = 31_536_000\n"
        "SECURE_HSTS_INCLUDE_SUBDOMAINS = True\n"
        "SECURE_HSTS_PRELOAD = True\n"
        "SESSION_COOKIE_SECURE = True\n"
        "CSRF_COOKIE_SECURE = True\n"
        # Django 6.1's startproject sends mail to the console (mail.E001 under --deploy).
        "MAILERS = {'default': {'BACKEND': 'django.core.mail.backends.smtp.EmailBackend'}}\n"
    )


def wait_for(condition: Any, what: str, shop: Shop) -> None:
    deadline = time.monotonic() + EFFECT_TIMEOUT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {EFFECT_TIMEOUT_SECONDS} s.\n{shop.logs()}")
        time.sleep(0.5)


def redeliver(topic: str) -> int:
    """Produces the topic's one record a second time, as a producer retry would, and returns
    the offset after both."""
    reader = Consumer(
        {
            **kafka_connection_config(),
            "group.id": f"test-install-reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        record = reader.poll(KAFKA_TIMEOUT_SECONDS)
        assert record is not None
        assert record.error() is None, record.error()
    finally:
        reader.close()
    producer = Producer(kafka_connection_config())
    producer.produce(
        topic, key=record.key(), value=record.value(), headers=record.headers(), partition=0
    )
    assert producer.flush(KAFKA_TIMEOUT_SECONDS) == 0
    offset = record.offset()
    assert offset is not None
    return offset + 2


def committed_offset(group: str, topic: str) -> int:
    client = Consumer({**kafka_connection_config(), "group.id": group})
    try:
        [position] = client.committed([TopicPartition(topic, 0)], timeout=KAFKA_TIMEOUT_SECONDS)
        return position.offset
    finally:
        client.close()


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("python", "django"),
    [(PYTHON_3_11, DJANGO_LTS), (PYTHON_3_12, DJANGO_NEWEST), (PYTHON_3_13, DJANGO_6_0)],
    ids=["django-lts", "django-newest", "django-6.0-python-3.13"],
)
def test_a_new_project_follows_the_readme_and_its_handler_runs_exactly_once(
    python, django, wheel, database, topic, tmp_path
):
    group = f"test-install-{uuid.uuid4().hex[:8]}"
    shop = Shop(tmp_path, python, database, topic, group)
    shop.run("pip", "install", "--quiet", django, cwd=tmp_path)
    shop.run("django-admin", "startproject", "shop", cwd=tmp_path)
    # Where the README's first step finds the wheel.
    (shop.directory / "dist").mkdir()
    shutil.copy(wheel, shop.directory / "dist")
    (shop.directory / "shop" / "install_settings.py").write_text(
        settings_module(database=database, production=False)
    )
    (shop.directory / "shop" / "production_settings.py").write_text(
        settings_module(database=database, production=True)
    )
    try:
        for block in readme_blocks():
            shop.follow(block)
        assert django.split("==")[1] in shop.run("python", "-m", "django", "--version")

        def shipments() -> int:
            return shop.query("SELECT count(*) FROM orders_shipment WHERE order_id = '42'")

        wait_for(lambda: shipments() == 1, "The handler's shipment", shop)
        end = redeliver(topic)
        wait_for(lambda: committed_offset(group, topic) == end, "The redelivery consumed", shop)
        assert shipments() == 1, shop.logs()
        assert (
            shop.query("SELECT count(*) FROM inbox_message WHERE consumer_group = %s", group) == 1
        )
    finally:
        shop.stop()
    deploy = shop.run(
        "python",
        "manage.py",
        "check",
        "--deploy",
        DJANGO_SETTINGS_MODULE="shop.production_settings",
    )
    assert "System check identified no issues (0 silenced)." in deploy, deploy
