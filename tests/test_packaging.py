"""The distribution: an sdist and a wheel built as `pip install` builds them (PEP 517, in an
isolated environment), from a copy of this checkout. The wheel carries the core apps, what
they share, the console and the analytics, with every migration and template, and nothing of
this repository's own (its project/, demo, scenarios, benchmarks, tests, .local)."""

import tarfile
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

from tests.distribution import build_distributions

REPOSITORY = Path(settings.BASE_DIR)
PACKAGES = ("kafka_events", "outbox", "inbox", "console", "analytics")
NOT_SHIPPED = ("project/", "demo/", "scenarios/", "benchmarks/", "tests/", ".local/", "manage.py")


@pytest.fixture(scope="module")
def distributions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_distributions(
        workspace=tmp_path_factory.mktemp("checkout"), output=tmp_path_factory.mktemp("dist")
    )


def _shipped_sources(package: str, pattern: str) -> set[str]:
    return {
        str(path.relative_to(REPOSITORY))
        for path in (REPOSITORY / package).rglob(pattern)
        if "__pycache__" not in path.parts
    }


def test_the_wheel_holds_every_module_migration_and_template_of_the_package(distributions):
    names = set(zipfile.ZipFile(distributions["wheel"]).namelist())
    for package in PACKAGES:
        modules = _shipped_sources(package, "*.py")
        assert modules, package
        # Migrations among them.
        assert modules <= names, sorted(modules - names)
    templates = _shipped_sources("console", "*.html")
    assert templates
    assert templates <= names, sorted(templates - names)


def test_the_wheel_ships_nothing_of_this_repository_alone(distributions):
    names = zipfile.ZipFile(distributions["wheel"]).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {*PACKAGES, "reliable_kafka_events-0.1.0.dist-info"}
    assert not [name for name in names if name.startswith(NOT_SHIPPED)]


def test_the_wheel_declares_its_dependencies_and_extras(distributions):
    metadata = (
        zipfile.ZipFile(distributions["wheel"])
        .read("reliable_kafka_events-0.1.0.dist-info/METADATA")
        .decode()
    )
    requirements = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = [line for line in requirements if "extra ==" not in line]
    assert any("Django<6.2,>=5.2" in line for line in core), core
    # What tests/test_install.py runs on.
    assert "Requires-Python: <3.14,>=3.11" in metadata.splitlines()
    assert any(line.startswith("Requires-Dist: confluent-kafka") for line in core)
    # The console, the analytics and the tracing SDK only with their extras.
    assert not any("djangorestframework" in line or "pyspark" in line for line in core)
    for extra in ("console", "analytics", "tracing"):
        assert f"Provides-Extra: {extra}" in metadata


def test_the_sdist_holds_the_package_and_nothing_local(distributions):
    with tarfile.open(distributions["sdist"]) as sdist:
        names = [name.split("/", 1)[1] for name in sdist.getnames() if "/" in name]
    assert "pyproject.toml" in names
    assert "outbox/migrations/0001_initial.py" in names
    assert "console/templates/admin/index.html" in names
    assert not [name for name in names if name.startswith((".local/", ".venv/", ".git/"))]
