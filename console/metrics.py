"""/metrics for Prometheus: the counters and histograms of outbox.metrics and inbox.metrics,
summed over every process when PROMETHEUS_MULTIPROC_DIR is set (kafka_events/process_metrics.py),
else this process's own; plus gauges read from the database at scrape time, so that the
backlog is the same whichever process answers."""

import contextlib
import hmac
from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

import inbox.metrics  # noqa: F401  (registers the inbox's counters in this process)
import outbox.metrics  # noqa: F401  (registers the relay's counters in this process)
from console.selectors import status_counts
from inbox.models import InboxMessage
from inbox.selectors import inbox_held_key_counts
from kafka_events.process_metrics import multiprocess_directory
from outbox.models import OutboxEvent
from outbox.selectors import outbox_oldest_pending_age_seconds


class DatabaseBacklogCollector(Collector):
    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Names only: registration must not query the database (it happens at import).
        yield GaugeMetricFamily("outbox_events", "", labels=["status"])
        yield GaugeMetricFamily("inbox_messages", "", labels=["status"])
        yield GaugeMetricFamily("inbox_held_keys", "", labels=["group"])
        yield GaugeMetricFamily("inbox_parked_messages", "", labels=["group"])
        yield GaugeMetricFamily("outbox_oldest_pending_age_seconds", "")
        yield GaugeMetricFamily("console_database_up", "")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            outbox = status_counts(OutboxEvent)
            inbox = status_counts(InboxMessage)
            oldest = outbox_oldest_pending_age_seconds(outbox.backlog)
            held = inbox_held_key_counts()
        except DatabaseError:
            up = GaugeMetricFamily("console_database_up", "The database answered the scrape.")
            up.add_metric([], 0)
            yield up
            return
        for name, side, counts in (
            ("outbox_events", "Outbox", outbox.counts),
            ("inbox_messages", "Inbox", inbox.counts),
        ):
            rows = GaugeMetricFamily(
                name, f"{side} rows by status (DONE estimated on big tables).", labels=["status"]
            )
            for status, count in counts.items():
                rows.add_metric([status], count)
            yield rows
        held_keys = GaugeMetricFamily(
            "inbox_held_keys", "Keys held by a failed message (ordering key).", labels=["group"]
        )
        parked = GaugeMetricFamily(
            "inbox_parked_messages", "Messages parked behind a held key.", labels=["group"]
        )
        for group, (keys, messages) in sorted(held.items()):
            held_keys.add_metric([group], keys)
            parked.add_metric([group], messages)
        yield held_keys
        yield parked
        age = GaugeMetricFamily(
            "outbox_oldest_pending_age_seconds", "Age of the oldest PENDING outbox event (0: none)."
        )
        age.add_metric([], oldest or 0.0)
        yield age
        up = GaugeMetricFamily("console_database_up", "The database answered the scrape.")
        up.add_metric([], 1)
        yield up


_collector = DatabaseBacklogCollector()
# A second import of this module (under another name) finds it registered already.
with contextlib.suppress(ValueError):
    REGISTRY.register(_collector)


def monitoring_access_refusal(request: HttpRequest, *, setting: str) -> HttpResponse | None:
    """The answer that refuses `request` to a monitoring endpoint guarded by the token in
    `setting` (METRICS_TOKEN, HEALTH_TOKEN), or None when it may pass."""
    token = getattr(settings, setting)
    if not token:
        if settings.MONITORING_OPEN_WITHOUT_TOKEN:
            return None
        return HttpResponse(
            f"Closed until its token is set: set {setting} and send it as a bearer token.\n",
            status=403,
            content_type="text/plain",
        )
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        response = HttpResponse(
            "A bearer token is required.\n", status=401, content_type="text/plain"
        )
        response["WWW-Authenticate"] = "Bearer"
        return response
    return None


def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = monitoring_access_refusal(request, setting="METRICS_TOKEN")
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(_scrape_registry()), content_type=CONTENT_TYPE_LATEST)


def _scrape_registry() -> CollectorRegistry:
    directory = multiprocess_directory()
    if directory is None:
        return REGISTRY
    # The files of every process (this one's included), and the database's gauges.
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    registry.register(_collector)
    return registry
