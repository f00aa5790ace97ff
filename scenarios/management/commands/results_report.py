"""Writes docs/RESULTS.md: runs the outbox, inbox, console and analytics benchmarks and the full
scenario suite, and puts their figures, the machine, the command lines and the date in one
page. Every figure in the page comes from a command run here; none is written by hand.

    manage.py results_report [--scenario-events N] [--analytics-events N] [--skip-benchmarks]
"""

import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from scenarios.definitions import OUTAGE_GRACE_SECONDS, SCENARIOS, SUITE
from scenarios.management.commands.scenario_run import after_last_fault
from scenarios.runner import DEFAULT_KEYS

BENCH_TIMEOUT_SECONDS = 3 * 3600
SCENARIOS_TIMEOUT_SECONDS = 6 * 3600


@dataclass
class Section:
    title: str
    command: list[str]
    env: dict[str, str]
    returncode: int
    seconds: float
    output: str


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    return {
        "CPU": cpu,
        "Cores": str(os.cpu_count()),
        "Memory": memory,
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
    }


def _run(title: str, command: list[str], env: dict[str, str], timeout: float) -> Section:
    started = time.monotonic()
    process = subprocess.run(
        command,
        cwd=settings.BASE_DIR,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = process.stdout + (f"\n{process.stderr}" if process.returncode else "")
    return Section(
        title, command, env, process.returncode, time.monotonic() - started, output.strip()
    )


def _command_line(section: Section) -> str:
    shown = [
        "python" if part == sys.executable else part.replace(str(settings.BASE_DIR) + "/", "")
        for part in section.command
    ]
    prefix = " ".join(f"{name}={shlex.quote(value)}" for name, value in section.env.items())
    return (prefix + " " if prefix else "") + shlex.join(shown)


def _scenario_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| Scenario | N | Lost | Duplicate effects | Duplicates in the log | Order inversions "
        "| Stuck | Faults | Delivery complete after the last fault | Total | Result |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for result in results:
        after = after_last_fault(
            result["seconds_after_last_fault"],
            complete=result["complete"],
            before=result.get("delivered_before_last_fault", False),
        )
        title = SCENARIOS[result["name"]].title if result["name"] in SCENARIOS else ""
        lines.append(
            f"| {result['name']}: {title} | {result['events']:,} | {result['lost']} | "
            f"{result['duplicate_effects']} | {result['log_duplicates']} | "
            f"{result['inversions']} | {result['stuck']} | {result['faults']} | "
            f"{after} | "
            f"{result['seconds']:.0f} s | {'PASS' if result['passed'] else 'FAIL'} |"
        )
    return lines


class Command(BaseCommand):
    help = "Runs the benchmarks and the full scenario suite and writes docs/RESULTS.md."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--scenario-events", type=int, help="Default: each scenario's full size."
        )
        parser.add_argument("--analytics-events", type=int, default=1_000_000)
        parser.add_argument("--skip-benchmarks", action="store_true")
        parser.add_argument(
            "--output", default=str(Path(settings.BASE_DIR) / "docs" / "RESULTS.md")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        started = datetime.now(UTC)
        python = sys.executable
        sections: list[Section] = []
        if not options["skip_benchmarks"]:
            benchmarks: list[tuple[str, list[str], dict[str, str]]] = [
                ("Outbox benchmark", [python, "benchmarks/outbox_bench.py"], {}),
                ("Inbox benchmark", [python, "benchmarks/inbox_bench.py"], {}),
                # Its page requests log at INFO (django-axes's sweeps): not figures.
                (
                    "Console benchmark",
                    [python, "benchmarks/console_bench.py"],
                    {"LOG_LEVEL": "WARNING"},
                ),
                (
                    "Analytics benchmark",
                    [
                        python,
                        "benchmarks/analytics_bench.py",
                        "--events",
                        str(options["analytics_events"]),
                    ],
                    {},
                ),
            ]
            for title, command, env in benchmarks:
                self.stdout.write(f"running {title}: {shlex.join(command)}")
                self.stdout.flush()
                sections.append(_run(title, command, env, BENCH_TIMEOUT_SECONDS))
        with tempfile.TemporaryDirectory() as folder:
            result_file = Path(folder) / "scenarios.json"
            command = [python, "manage.py", "scenario_run", *SUITE, "--json", str(result_file)]
            if options["scenario_events"]:
                command += ["--events", str(options["scenario_events"])]
            self.stdout.write(f"running the scenarios: {shlex.join(command)}")
            self.stdout.flush()
            scenarios = _run("Scenarios", command, {}, SCENARIOS_TIMEOUT_SECONDS)
            results = json.loads(result_file.read_text()) if result_file.exists() else []
        finished = datetime.now(UTC)
        page = self._page(started, finished, sections, scenarios, results)
        Path(options["output"]).write_text(page)
        self.stdout.write(f"wrote {options['output']}")

    @staticmethod
    def _page(
        started: datetime,
        finished: datetime,
        sections: list[Section],
        scenarios: Section,
        results: list[dict[str, Any]],
    ) -> str:
        lines = [
            "# Results",
            "",
            "Generated by `make results` (`manage.py results_report`); do not edit by hand: "
            "every figure below was printed by the command named above it.",
            "",
            f"- Date: {started:%Y-%m-%d %H:%M} to {finished:%Y-%m-%d %H:%M} UTC",
        ]
        lines += [f"- {name}: {value}" for name, value in machine().items()]
        lines += [
            "- Services: PostgreSQL, Redis and Apache Kafka started by scripts/services.sh on "
            "this machine (benchmarks: the default single-broker set; scenarios: the isolated "
            "3-broker KRaft set, replication factor 3, min.insync.replicas=2, unclean leader "
            "election off)",
            "",
            "## Delivery under faults",
            "",
            f"Command: `{_command_line(scenarios)}` (exit code {scenarios.returncode}, "
            f"{scenarios.seconds / 60:.0f} min). Each scenario writes N events on "
            f"{_keys(results)} keys with per-key sequence numbers through `outbox.publish`; the "
            "delivery checker then reads the outbox, the whole Kafka log (read_committed) and "
            'the inbox and effect tables. "Before last fault": every event had been applied '
            "before the last fault began, so there is no time to report. Faults: the faults "
            "whose effect the schedule saw (restarts not counted). See docs/scenarios.md.",
            "",
            *(_scenario_table(results) if results else ["No scenario result was written."]),
            "",
        ]
        for result in results:
            if result.get("problems"):
                lines.append(f"- {result['name']}: {'; '.join(result['problems'])}")
        extra_notes = []
        for result in results:
            extra = result.get("extra", {})
            if "done_during_outage" in extra:
                extra_notes.append(
                    f"- two-brokers-down: rows marked DONE during the outage "
                    f"({extra['outage']['start']} to {extra['outage']['end']}, "
                    f"{OUTAGE_GRACE_SECONDS:g} s grace): {extra['done_during_outage']}; "
                    f"events waiting at its end: {extra['pending_at_outage_end']}"
                )
            if "poison_failed_rows" in extra:
                extra_notes.append(
                    f"- poison: {extra['poison_records']} poison records sent, "
                    f"{extra['poison_failed_rows']} FAILED inbox rows"
                )
            if extra.get("stall"):
                extra_notes.append(
                    f"- {result['name']}, when it stalled: {'; '.join(extra['stall'])}"
                )
            if result.get("delivered_before_last_fault"):
                extra_notes.append(
                    f"- {result['name']}: every event was applied before the last fault began "
                    "(it struck an idle system)"
                )
            if extra.get("kills"):
                kills = ", ".join(f"{name} x{count}" for name, count in extra["kills"].items())
                extra_notes.append(f"- {result['name']}: SIGKILLs {kills}")
        if extra_notes:
            lines += ["", *extra_notes]
        lines += ["", "Output of the command:", "", "```", scenarios.output, "```", ""]
        for section in sections:
            lines += [
                f"## {section.title}",
                "",
                f"Command: `{_command_line(section)}` (exit code {section.returncode}, "
                f"{section.seconds:.0f} s)",
                "",
                "```",
                section.output,
                "```",
                "",
            ]
        return "\n".join(lines)


def _keys(results: list[dict[str, Any]]) -> str:
    """The number of keys of the runs, as the results give it."""
    keys = sorted({result["keys"] for result in results}) or [DEFAULT_KEYS]
    return " or ".join(f"{count:,}" for count in keys)
