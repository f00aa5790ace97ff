"""The same job on a Spark standalone cluster: a master and a worker started from the pyspark
install on loopback, and `manage.py analytics_run` with SPARK_MASTER=spark://... in its own
process (one SparkContext per process: the suite's local session stays where it is)."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from django.conf import settings
from django.db import connection

from analytics.models import AnalyticsRun, DeliveryLagStat, ReconciliationFinding
from kafka_events.conf import kafka_settings
from tests.analytics.factories import SLA, history_start, planted_history

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT_SECONDS = 60
JOB_TIMEOUT_SECONDS = 300


def _free_ports(count: int) -> list[int]:
    """Ports free now and different from each other: every probe stays bound until all are
    drawn (one probe at a time can draw the same port twice, and then the worker's UI can take
    the port the test reads as the master's)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


def _spark_env() -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "PYSPARK_PYTHON": sys.executable,
    }


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except (OSError, ValueError):
        # Not up yet, or not the master's UI (a page that is not JSON): the deadline decides.
        return 0


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[str]:
    """A master and one worker (1 core, 1 GB), stopped afterwards; yields the master URL."""
    port, ui_port, worker_ui_port = _free_ports(3)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    master_url = f"spark://127.0.0.1:{port}"
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("master", "worker")}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(ui_port),
                ],
                env=_spark_env(),
                stdout=logs["master"],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        processes.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(worker_ui_port),
                    "--work-dir",
                    str(tmp_path / "work"),
                ],
                env=_spark_env(),
                stdout=logs["worker"],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while _alive_workers(ui_port) < 1:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                pytest.fail(
                    "the Spark standalone cluster did not start:\n"
                    + (tmp_path / "master.log").read_text(errors="replace")[-3000:]
                    + (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
                )
            time.sleep(0.5)
        yield master_url
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in reversed(processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for log in logs.values():
            log.close()


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_job_runs_on_a_standalone_cluster(standalone_cluster: str, kafka_topic: Any) -> None:
    topics = {"orders": kafka_topic(partitions=2), "users": kafka_topic()}
    history = planted_history(topics=topics, since=history_start(), seed=11)
    database = connection.settings_dict
    env = {
        **_spark_env(),
        "DJANGO_SETTINGS_MODULE": "project.settings.local",
        # The test database, which this test has committed its history to.
        "DATABASE_URL": (
            f"postgres://{database['USER']}:{database['PASSWORD']}@{database['HOST']}:"
            f"{database['PORT'] or 5432}/{database['NAME']}"
        ),
        "SPARK_MASTER": standalone_cluster,
        "SPARK_DRIVER_MEMORY": "512m",
        "SPARK_EXECUTOR_MEMORY": "512m",
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.BOOTSTRAP_SERVERS,
        "ANALYTICS_CONSUME_SLA_SECONDS": str(int(SLA.total_seconds())),
        "ANALYTICS_EXPECTED_CONSUMERS": ",".join(
            f"{key}={'|'.join(groups)}" for key, groups in history.expected_consumers.items()
        ),
        "ANALYTICS_JDBC_PARTITIONS": "2",
    }
    job = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "analytics_run",
            "--since",
            history.since.isoformat(),
            "--until",
            history.until.isoformat(),
        ],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_SECONDS,
        check=False,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-5000:]

    run = AnalyticsRun.objects.get()
    assert run.status == AnalyticsRun.Status.SUCCEEDED, run.error
    assert run.spark_master == standalone_cluster
    assert run.outbox_rows == history.outbox_rows
    assert run.inbox_rows == history.inbox_rows
    assert run.kafka_records == history.kafka_records
    found = {
        (f.kind, f.event_id, f.consumer_group)
        for f in ReconciliationFinding.objects.filter(run=run)
    }
    assert found == history.findings
    counts = {
        (s.hour, s.topic, s.event_type, s.consumer_group, s.stage): s.count
        for s in DeliveryLagStat.objects.filter(run=run)
    }
    assert counts == {key: len(lags) for key, lags in history.lags.items()}
