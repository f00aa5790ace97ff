"""This checkout's isolated services, the scenarios' own (scenarios/ports.py):

    manage.py scenario_services up|down|status

`status` names the ports, the pids of this checkout's services, and any other process that
listens on those ports."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scenarios import faults, ports


class Command(BaseCommand):
    help = "Starts, stops or shows this checkout's isolated services (the scenarios' own)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=("up", "down", "status"))

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] != "status":
            self.stdout.write(faults.services(options["action"], timeout=900).rstrip())
            return
        block = ports.recorded_block()
        self.stdout.write(
            f"folder {ports.local_dir()}, port block {block.number}: PostgreSQL "
            f"{block.postgres}, Redis {block.redis}, Kafka {faults.bootstrap_servers(block)}"
        )
        for service, pid in sorted(ports.own_pids().items()):
            self.stdout.write(f"{service}: {ports.describe_process(pid)}")
        foreign = ports.foreign_listeners(block)
        for port, pids in sorted(foreign.items()):
            holders = ", ".join(ports.describe_process(pid) for pid in pids) or "unknown"
            self.stdout.write(f"port {port} is held by another owner: {holders}")
        if foreign:
            raise CommandError("another owner holds some of these ports; `up` would move them")
