"""inbox/metrics.py: what one batch adds to the counters, per group."""

import pytest
from django.db import transaction
from prometheus_client import REGISTRY

from inbox import handler
from inbox.services.recording import inbox_message_record_batch
from tests.inbox.conftest import records
from tests.inbox.factories import Event

pytestmark = pytest.mark.django_db

GROUP = "metrics-group"


def value(name, **labels):
    return REGISTRY.get_sample_value(name, {"group": GROUP, **labels}) or 0.0


def test_a_batch_counts_consumed_processed_duplicates_failed_and_latencies(inbox_registry):
    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def apply(message):
        if message.payload.get("fail"):
            raise RuntimeError("no")

    names = ("inbox_consumed_total", "inbox_processed_total", "inbox_duplicates_total")
    before = {name: value(name) for name in names}
    failed_before = value("inbox_failed_total", reason="handler")
    latency_before = value("inbox_handler_seconds_count")
    lag_before = value("inbox_consume_lag_seconds_count")

    ok, bad = Event(), Event(payload={"fail": True})
    with transaction.atomic():
        result = inbox_message_record_batch(group=GROUP, records=records([ok, ok, bad]))
    result.record_metrics(GROUP)

    assert value("inbox_consumed_total") - before["inbox_consumed_total"] == 3
    assert value("inbox_processed_total") - before["inbox_processed_total"] == 1
    assert value("inbox_duplicates_total") - before["inbox_duplicates_total"] == 1
    assert value("inbox_failed_total", reason="handler") - failed_before == 1
    assert value("inbox_handler_seconds_count") - latency_before == 2
    assert value("inbox_consume_lag_seconds_count") - lag_before == 1
