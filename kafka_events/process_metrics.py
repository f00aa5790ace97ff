"""Where this process keeps its Prometheus counters.

The relay runs in Celery workers or `outbox_relay`, the consumers in `inbox_consume`, and
/metrics is served by the web processes: counters kept in one process's memory would never
reach the scrape. With PROMETHEUS_MULTIPROC_DIR set (prometheus-client's multiprocess
mode), every process writes its counters and histograms to files in that directory and
/metrics sums them. Unset, each process keeps its own, as prometheus-client does by default.
"""

import os
import socket

from prometheus_client import values

MULTIPROCESS_DIRECTORY_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_directory() -> str | None:
    return os.environ.get(MULTIPROCESS_DIRECTORY_VARIABLE) or None


def configure_process_metrics() -> None:
    """Call before any metric is created: at the start of the process (this project does in
    project/__init__.py)."""
    directory = multiprocess_directory()
    if directory is None:
        return
    os.makedirs(directory, exist_ok=True)
    # Files are named by this identifier. The host name keeps apart the processes of several
    # containers that share one directory (their pids repeat); '_' separates the parts of
    # the file name, so it must not appear in it.
    host = socket.gethostname().replace("_", "-")
    values.ValueClass = values.MultiProcessValue(lambda: f"{host}-{os.getpid()}")
