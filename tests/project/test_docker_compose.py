"""docker-compose.yml cannot run on a machine without a Docker engine; these tests keep it
equivalent to the settings and to scripts/services.sh."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from kafka_events.process_metrics import MULTIPROCESS_DIRECTORY_VARIABLE
from project.settings.environment import PRODUCTION_REQUIRED_VARIABLES

BASE_DIR = Path(settings.BASE_DIR)
APP_SERVICES = ("web", "worker", "beat", "consumer")
SERVICES = ("postgres", "redis", "kafka", *APP_SERVICES)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())


def variables_read_by_settings() -> set[str]:
    names: set[str] = set()
    for module in (BASE_DIR / "project" / "settings").glob("*.py"):
        names |= set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]*)"', module.read_text()))
    return names


def test_every_service_is_there_with_a_healthcheck(compose):
    assert set(SERVICES) <= set(compose["services"])
    for name in SERVICES:
        assert "test" in compose["services"][name].get("healthcheck", {}), name


def test_app_services_share_one_image_and_the_required_variables(compose):
    for name in APP_SERVICES:
        service = compose["services"][name]
        assert service["build"] == ".", name
        environment = service["environment"]
        missing = [
            v for v in (*PRODUCTION_REQUIRED_VARIABLES, "CELERY_BROKER_URL") if v not in environment
        ]
        assert not missing, f"{name} lacks {missing}"
        assert environment["DJANGO_SETTINGS_MODULE"] == "project.settings.production"
        assert set(service["depends_on"]) == {"postgres", "redis", "kafka"}


def test_app_variables_are_ones_the_settings_read(compose):
    known = variables_read_by_settings() | {
        "DJANGO_SETTINGS_MODULE",
        MULTIPROCESS_DIRECTORY_VARIABLE,
    }
    for name in APP_SERVICES:
        unknown = set(compose["services"][name]["environment"]) - known
        assert not unknown, f"{name} sets variables no setting reads: {unknown}"


def test_kafka_is_the_official_image_of_the_version_the_scripts_run(compose):
    pom = (BASE_DIR / "scripts" / "kafka" / "pom.xml").read_text()
    version = re.search(r"<kafka.version>(.+?)</kafka.version>", pom).group(1)
    kafka = compose["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{version}"
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


def dockerfile_run_step(containing: str) -> str:
    """The RUN instruction of the Dockerfile that contains `containing`, continuations joined."""
    text = (BASE_DIR / "Dockerfile").read_text().replace("\\\n", " ")
    steps = [line for line in text.splitlines() if line.startswith("RUN ") and containing in line]
    assert len(steps) == 1, f"one RUN step with {containing!r} expected, found {steps}"
    return steps[0].removeprefix("RUN ")


def test_the_images_static_files_carry_the_manifest_production_serves_from(tmp_path):
    # The production storage refuses to serve a file its manifest does not name: collect with
    # the image's own command line and check that the manifest names the admin's assets.
    step = dockerfile_run_step("collectstatic")
    environment = dict(
        assignment.split("=", 1) for assignment in shlex.split(step) if "=" in assignment
    )
    assert environment["DJANGO_SETTINGS_MODULE"] == "project.settings.production"
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=BASE_DIR,
        env={"PATH": os.environ["PATH"], **environment, "STATIC_ROOT": str(tmp_path)},
        check=True,
        timeout=300,
    )
    manifest = json.loads((tmp_path / "staticfiles.json").read_text())
    assert "unfold/css/styles.css" in manifest["paths"]


def test_the_image_has_the_spark_jars_and_what_the_healthchecks_call(compose):
    assert "scripts/spark-jars.sh" in dockerfile_run_step("spark-jars.sh")
    dockerfile = (BASE_DIR / "Dockerfile").read_text()
    assert "SPARK_JARS_DIR=/opt/spark-jars" in dockerfile
    installed = dockerfile_run_step("apt-get install").split()
    for name, service in compose["services"].items():
        if "pgrep" in str(service.get("healthcheck", {}).get("test")):
            assert "procps" in installed, f"{name}'s healthcheck calls pgrep"
        if "curl" in str(service.get("healthcheck", {}).get("test")) and "build" in service:
            assert "curl" in installed, f"{name}'s healthcheck calls curl"


def test_the_consumer_reads_the_group_the_demo_registers(compose):
    environment = compose["services"]["consumer"]["environment"]
    assert environment["DEMO_ENABLED"] == "true"
    command = compose["services"]["consumer"]["command"]
    assert "${INBOX_CONSUMER_GROUP:-demo-delivery}" in command
    from project.settings.demo import DEMO_DELIVERY_GROUP

    assert DEMO_DELIVERY_GROUP == "demo-delivery"
    assert "demo_traffic" in compose["services"]["demo"]["command"]


def test_compose_refuses_to_start_without_a_secret_key(compose):
    # `${NAME:?message}`: compose stops with the message when NAME is unset or empty.
    for name in APP_SERVICES:
        secret = compose["services"][name]["environment"]["SECRET_KEY"]
        assert re.fullmatch(r"\$\{SECRET_KEY:\?[^}]+\}", secret), (name, secret)
