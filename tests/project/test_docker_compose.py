"""docker-compose.yml cannot run on a machine without a Docker engine; these tests keep it
equivalent to the settings and to scripts/services.sh."""

import re
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from project.process_metrics import MULTIPROCESS_DIRECTORY_VARIABLE
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
