"""Runs fault-injection scenarios on the isolated 3-broker cluster and prints a table.

    manage.py scenario_run [names...] [--events N] [--keys 1000] [--json PATH] [--keep-services]

Without names it runs the scenarios that must pass (scenarios.definitions.SUITE); without
--events each runs at its full size (100,000 events; 20,000 for the fault-heavy ones). It
starts the isolated services (scripts/services.sh up with the scenarios' environment, on ports
no other checkout holds: scenarios/ports.py), re-runs itself under that environment when
started with another, and stops the services at the end if it started them; the default
services are never touched."""

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from scenarios import faults
from scenarios.definitions import SCENARIOS, SUITE, Scenario, pick
from scenarios.runner import DEFAULT_KEYS, ScenarioResult, prepare_database, run_scenario

COLUMNS = (
    ("scenario", 28),
    ("N", 8),
    ("lost", 5),
    ("dup eff", 7),
    ("log dups", 8),
    ("invers", 6),
    ("stuck", 5),
    ("faults", 6),
    ("after last fault", 17),
    ("total", 7),
    ("result", 6),
)


def table_header() -> str:
    return "  ".join(
        name.rjust(width) if i else name.ljust(width) for i, (name, width) in enumerate(COLUMNS)
    )


def after_last_fault(seconds: float | None, *, complete: bool, before: bool) -> str:
    """The "after last fault" cell: a time, or why there is none."""
    if not complete:
        return "incomplete"
    if before:
        # Every event was applied before the last fault began: no time to report.
        return "before last fault"
    return f"{seconds:.1f} s" if seconds is not None else "-"


def table_row(result: ScenarioResult) -> str:
    after = after_last_fault(
        result.seconds_after_last_fault,
        complete=result.complete,
        before=result.delivered_before_last_fault,
    )
    verdict = "PASS" if result.passed else "FAIL"
    if result.expect_fail:
        verdict += " (expected)" if not result.passed else " (UNEXPECTED)"
    values = (
        result.name,
        f"{result.events:,}",
        result.report.lost,
        result.report.duplicate_effects,
        result.report.log_duplicates,
        result.report.inversions,
        result.report.stuck,
        result.faults,
        after,
        f"{result.seconds:.0f} s",
        verdict,
    )
    return "  ".join(
        str(value).rjust(width) if i else str(value).ljust(width)
        for i, (value, (_, width)) in enumerate(zip(values, COLUMNS, strict=True))
    )


class Command(BaseCommand):
    help = "Runs fault-injection scenarios on the isolated cluster and checks delivery."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", help=f"Default: {' '.join(SUITE)}")
        parser.add_argument("--events", type=int, help="Default: each scenario's full size.")
        parser.add_argument("--keys", type=int, default=DEFAULT_KEYS)
        parser.add_argument("--seed", type=int)
        parser.add_argument("--json", help="Also write the results to this file.")
        parser.add_argument("--list", action="store_true", help="List the scenarios and exit.")
        parser.add_argument(
            "--keep-services",
            action="store_true",
            help="Leave the isolated services running at the end, for debugging (by default "
            "they are stopped if this run started them).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            for scenario in SCENARIOS.values():
                size = f"{scenario.full_events():,}"
                self.stdout.write(f"{scenario.name:30} {size:>8}  {scenario.title}")
            return
        try:
            scenarios = pick(options["names"] or SUITE)
        except KeyError as error:
            raise CommandError(str(error)) from error
        # Before this process's settings are fixed (the re-run below): the ports may move.
        faults.claim_ports()
        if not faults.is_isolated():
            self._reexecute()
        # SIGTERM unwinds like an error, so the runner stops the processes it started.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        started_here = not faults.running()
        try:
            self._run(scenarios, options)
        finally:
            # On success, failure, Ctrl-C or SIGTERM: the services this run started stop.
            if started_here and not options["keep_services"]:
                self.stdout.write(faults.services("down").rstrip())

    def _run(self, scenarios: list[Scenario], options: dict[str, Any]) -> None:
        self.stdout.write(faults.services("up", timeout=900).rstrip())
        prepare_database()
        results: list[ScenarioResult] = []
        self.stdout.write(table_header())
        self.stdout.flush()
        for scenario in scenarios:
            result = run_scenario(
                scenario,
                events=options["events"] or scenario.full_events(),
                keys=options["keys"],
                seed=options["seed"],
            )
            results.append(result)
            self.stdout.write(table_row(result))
            for line in result.extra.get("summary", []):
                # The figures a scenario reports beyond the table's (a lag, a read time).
                self.stdout.write(f"    {line}")
            if not result.passed:
                self.stdout.write("    " + "; ".join(result.problems()))
            if result.delivered_before_last_fault:
                self.stdout.write(
                    "    every event was applied before the last fault began: it struck an "
                    "idle system"
                )
            self.stdout.flush()
            if options["json"]:
                self._write_json(Path(options["json"]), results)
        failed = [r.name for r in results if not r.as_expected]
        if failed:
            raise CommandError(f"scenarios not as expected: {', '.join(failed)}", returncode=1)

    @staticmethod
    def _write_json(path: Path, results: list[ScenarioResult]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([r.as_dict() for r in results], indent=2, default=str))

    @staticmethod
    def _reexecute() -> None:
        """Runs this command again with the isolated services' environment."""
        if sys.argv[1:2] != ["scenario_run"]:
            raise CommandError(
                "scenario_run must run against the isolated services; run it from the shell "
                "(manage.py scenario_run) or with their environment (scenarios/faults.py)."
            )
        env = {**os.environ, **faults.isolated_environment()}
        env["DJANGO_SETTINGS_MODULE"] = "project.settings.local"
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        os.execve(sys.executable, [sys.executable, manage, *sys.argv[1:]], env)  # noqa: S606
