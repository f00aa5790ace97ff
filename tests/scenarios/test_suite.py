"""The scenario suite's bookkeeping, no service needed: every scenario has its test, the
timeouts nest (the runner gives up first, pytest last), and the results page takes its
figures from the code, not from fixed text."""

import ast
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scenarios.definitions import BROKEN, OUTAGE_GRACE_SECONDS, SCENARIOS, SUITE
from scenarios.management.commands import results_report
from scenarios.management.commands.scenario_run import after_last_fault
from scenarios.runner import COMPLETION_TIMEOUT_SECONDS
from tests.scenarios import limits

HERE = Path(__file__).parent


def _scenarios_run_in(module: str) -> dict[str, list[str]]:
    """test function -> the scenario names it passes to scenario_run(...)."""
    tree = ast.parse((HERE / module).read_text())
    runs: dict[str, list[str]] = {}
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "scenario_run"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                runs.setdefault(function.name, []).append(node.args[0].value)
    return runs


def test_every_scenario_of_the_suite_has_a_test():
    runs = _scenarios_run_in("test_scenarios.py")
    covered = [name for names in runs.values() for name in names]
    assert sorted(covered) == sorted(SUITE)  # each once, and nothing outside the suite
    assert len(SUITE) == 28


def test_every_broken_variant_has_a_test():
    runs = _scenarios_run_in("test_broken_variants.py")
    assert sorted(name for names in runs.values() for name in names) == sorted(BROKEN)
    assert set(SUITE) | set(BROKEN) == set(SCENARIOS)


def test_timeouts_nest():
    # The runner gives up on delivery (and writes its JSON, with where it stood) before the
    # subprocess is killed, which happens before pytest's timeout.
    assert COMPLETION_TIMEOUT_SECONDS < limits.RUN_TIMEOUT_SECONDS
    assert (
        limits.SERVICES_UP_SECONDS + limits.RUN_TIMEOUT_SECONDS + limits.SERVICES_DOWN_SECONDS
        < limits.TEST_TIMEOUT_SECONDS
    )
    for module in ("test_scenarios.py", "test_broken_variants.py"):
        tree = ast.parse((HERE / module).read_text())
        source = ast.unparse(tree)
        assert "pytest.mark.timeout(TEST_TIMEOUT_SECONDS)" in source, module


@pytest.mark.parametrize(
    ("seconds", "complete", "before", "cell"),
    [
        (12.34, True, False, "12.3 s"),
        (None, True, True, "before last fault"),
        (None, False, False, "incomplete"),
    ],
)
def test_after_last_fault_cell(seconds, complete, before, cell):
    assert after_last_fault(seconds, complete=complete, before=before) == cell


def test_results_page_takes_grace_and_keys_from_the_code(monkeypatch):
    monkeypatch.setattr(results_report, "OUTAGE_GRACE_SECONDS", OUTAGE_GRACE_SECONDS + 1.5)
    result = {
        "name": "two-brokers-down",
        "events": 2000,
        "keys": 250,
        "lost": 0,
        "duplicate_effects": 0,
        "log_duplicates": 0,
        "inversions": 0,
        "stuck": 0,
        "faults": 5,
        "seconds": 90.0,
        "complete": True,
        "seconds_after_last_fault": None,
        "delivered_before_last_fault": True,
        "passed": True,
        "problems": [],
        "extra": {
            "outage": {"start": "a", "end": "b"},
            "done_during_outage": 0,
            "pending_at_outage_end": 10,
        },
    }
    scenarios = results_report.Section("Scenarios", ["python"], {}, 0, 60.0, "output")
    now = datetime.now(UTC)
    page = results_report.Command._page(now, now, [], scenarios, [result])
    assert f"{OUTAGE_GRACE_SECONDS + 1.5:g} s grace" in page
    assert "on 250 keys" in page
    assert "| before last fault |" in page
    assert "two-brokers-down: every event was applied before the last fault began" in page
