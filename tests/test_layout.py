"""Imports flow one way (docs/architecture.md): kafka_events imports nothing of ours; outbox
and inbox import only kafka_events; so either stands alone in any Django project."""

import ast
from pathlib import Path

import pytest
from django.conf import settings

OURS = {"kafka_events", "outbox", "inbox", "analytics", "console", "project", "demo", "scenarios"}
MAY_IMPORT = {
    "kafka_events": set(),
    "outbox": {"kafka_events"},
    "inbox": {"kafka_events"},
}


def imported_packages(package: str) -> dict[str, set[str]]:
    """Our top-level packages each module of `package` imports: {module path: packages}."""
    found: dict[str, set[str]] = {}
    for path in sorted((Path(settings.BASE_DIR) / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(settings.BASE_DIR))] = (names & OURS) - {package}
    return found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_a_core_package_imports_only_what_it_may(package):
    modules = imported_packages(package)
    assert modules, f"no module found in {package}/"
    wrong = {
        module: sorted(packages - MAY_IMPORT[package])
        for module, packages in modules.items()
        if packages - MAY_IMPORT[package]
    }
    assert wrong == {}
