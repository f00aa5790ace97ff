"""The console's counts and times: the dashboard, /metrics, /api/stats/summary/ and the relay's
health read the relay's cursors, delivery records and held set (the event row is never
changed).

Most tests write what the relay writes (tests.outbox.test_selectors.log_relay_mix); the last
one runs a real LogRelay against Kafka and reads the counts before and after."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

import console.selectors
from console.consumer_lag import ConsumerLag
from console.selectors import (
    failures_by_error_class,
    health_parts,
    rate_series,
    status_counts,
)
from inbox.models import InboxMessage
from outbox.models import OutboxEvent, OutboxHeldEvent
from outbox.producer import close_producers
from outbox.selectors import outbox_oldest_pending_age_seconds, outbox_quarantined_keys
from outbox.services.repairs import outbox_event_discard, outbox_event_retry
from tests.conftest import publish_numbered
from tests.console.conftest import client_for
from tests.outbox.test_selectors import TIMED_OUT, TOO_BIG, hold, log_event, log_relay_mix, record

MIX_COUNTS = {"PENDING": 8, "FAILED": 1, "DONE": 4}


@pytest.fixture
def no_dashboard_cache(settings):
    settings.CONSOLE_DASHBOARD_CACHE_SECONDS = 0


def relay_health(oldest: float | None = None) -> str:
    parts = health_parts(kafka=ConsumerLag(reachable=True), oldest_pending_age=oldest)
    (relay,) = [part for part in parts if part.name == "Relay"]
    return relay.detail


@pytest.mark.django_db
def test_status_counts_read_the_cursors_and_the_held_set(no_dashboard_cache):
    log_relay_mix()
    counts = status_counts(OutboxEvent)
    assert (counts.counts, counts.done_estimated) == (MIX_COUNTS, False)
    # The inbox is counted as before, from its rows.
    assert status_counts(InboxMessage).counts == {"PENDING": 0, "FAILED": 0, "PARKED": 0, "DONE": 0}


@pytest.mark.django_db
def test_on_a_big_outbox_done_is_the_estimate_less_the_others(no_dashboard_cache, monkeypatch):
    log_relay_mix()
    estimates = {"outbox_event": 1_000_000, "outbox_delivery": 1_200_000}
    monkeypatch.setattr(console.selectors, "table_row_estimate", estimates.__getitem__)

    def refuse() -> int:
        raise AssertionError("DONE is counted over both tables on a big outbox")

    monkeypatch.setattr(console.selectors, "outbox_log_done_count", refuse)

    counts = status_counts(OutboxEvent)

    assert counts.done_estimated
    assert counts.counts == {"PENDING": 8, "FAILED": 1, "DONE": 1_000_000 - 9}


@pytest.mark.django_db
def test_publish_rates_count_the_published_records(no_dashboard_cache):
    now = timezone.now()
    published = log_event("published", age=timedelta(minutes=30))
    again = log_event("again", age=timedelta(minutes=30))
    failed = log_event("failed", age=timedelta(minutes=30))
    record(published, "PUBLISHED", at=now)
    record(again, "PUBLISHED", at=now)
    record(again, "PUBLISHED", at=now - timedelta(minutes=20))  # a replay's first sending
    record(published, "PUBLISHED", at=now - timedelta(hours=3))  # before the hour
    record(failed, "FAILED", at=now, error=TIMED_OUT)
    record(failed, "DISCARDED", at=now)

    hour = rate_series(period=timedelta(hours=1), bucket=timedelta(minutes=1))
    day = rate_series(period=timedelta(days=1), bucket=timedelta(hours=1))

    assert sorted(count for count in hour.published if count) == [1, 2]
    assert sum(day.published) == 4


@pytest.mark.django_db
def test_the_relay_health_reads_the_latest_published_record(no_dashboard_cache):
    assert relay_health().startswith("never published")
    event = log_event("a", age=timedelta(minutes=5))
    record(event, "PUBLISHED", at=timezone.now() - timedelta(seconds=40))
    record(event, "FAILED", at=timezone.now(), error=TIMED_OUT)  # later, not a publication
    detail = relay_health(oldest=75.0)
    assert detail.startswith("last publish 4")  # 40 s ago, give or take a slow test
    assert detail.endswith("oldest pending 75 s")


@pytest.mark.django_db
def test_failures_by_class_read_the_spent_heads(no_dashboard_cache):
    log_relay_mix()  # spent: TOO_BIG; backing-off, not spent: TIMED_OUT, not counted
    for key, error in (("also-spent", TOO_BIG), ("other", "KafkaException: fatal\n  at ...")):
        event = log_event(key, age=timedelta(minutes=1))
        hold(event, txid=1, attempts=10, error=error)
    outbox_side = {
        (row["error_class"], row["count"])
        for row in failures_by_error_class()
        if row["side"] == "outbox"
    }
    assert outbox_side == {("MSG_SIZE_TOO_LARGE", 2), ("KafkaException", 1)}


@pytest.mark.django_db
def test_metrics_stats_and_dashboard_show_the_log_relay_counts(
    no_dashboard_cache, viewer, operator
):
    log_relay_mix()

    metrics = Client().get("/metrics").content.decode()
    for status, count in MIX_COUNTS.items():
        assert f'outbox_events{{status="{status}"}} {float(count)}' in metrics
    age = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("outbox_oldest_pending_age_seconds ")
    )
    assert 15 * 60 <= age < 15 * 60 + 30

    summary = client_for(viewer).get("/api/stats/summary/").json()
    assert summary["outbox"]["counts"] == MIX_COUNTS
    assert 15 * 60 <= summary["outbox"]["oldest_pending_age_seconds"] < 15 * 60 + 30
    # delivered, delivered-late, replayed, and by-claim-relay (its record from migration 0012)
    assert sum(summary["rates_last_hour"]["published"]) == 4
    assert {
        (row["side"], row["error_class"], row["count"])
        for row in summary["failures_by_error_class"]
    } == {("outbox", "MSG_SIZE_TOO_LARGE", 1)}

    client = Client()
    client.force_login(operator)
    page = client.get("/admin/")
    assert page.status_code == 200
    assert page.context["console"]["outbox"]["counts"] == MIX_COUNTS
    assert [key.key for key in page.context["quarantined_keys"]] == [
        "spent",
        "replayed",
        "backing-off",
    ]
    assert page.context["published_last_hour"] == 4


# --- with a real relay ------------------------------------------------------------------------


def counts() -> dict[str, int]:
    return status_counts(OutboxEvent).counts


def held_keys() -> list[tuple[str, str, int, int]]:
    # By key: heads backing off come in the order of their next try, which has jitter.
    return sorted(
        (k.key, k.blocking_status, k.blocking_attempts, k.waiting_events)
        for k in outbox_quarantined_keys()
    )


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_counts_follow_a_real_relay(kafka_topic, size_limited_log_relay, settings):
    topic = kafka_topic()
    for seq in range(3):
        publish_numbered(topic, "fine", seq)
    big = publish_numbered(topic, "big", 0, too_large=True)
    publish_numbered(topic, "big", 1)
    other_big = publish_numbered(topic, "other-big", 0, too_large=True)
    assert counts() == {"PENDING": 6, "FAILED": 0, "DONE": 0}
    assert outbox_oldest_pending_age_seconds() is not None
    assert relay_health().startswith("never published")
    assert held_keys() == []

    result = size_limited_log_relay.run()

    assert (result.published, result.failed) == (3, 2)
    # The two big heads back off, and one event waits behind the first.
    assert counts() == {"PENDING": 3, "FAILED": 0, "DONE": 3}
    assert held_keys() == [("big", "PENDING", 1, 1), ("other-big", "PENDING", 1, 0)]
    assert sum(rate_series(period=timedelta(hours=1), bucket=timedelta(minutes=1)).published) == 3
    assert relay_health().startswith("last publish 0 s ago")
    assert failures_by_error_class() == []  # nothing is spent yet

    OutboxHeldEvent.objects.filter(attempts__gt=0).update(next_attempt_at=timezone.now())
    assert size_limited_log_relay.run().failed == 2

    # Attempts spent: both heads wait for an operator; the event behind one waits too.
    assert counts() == {"PENDING": 1, "FAILED": 2, "DONE": 3}
    assert held_keys() == [("big", "FAILED", 2, 1), ("other-big", "FAILED", 2, 0)]
    (failures,) = failures_by_error_class()
    assert (failures["side"], failures["count"]) == ("outbox", 2)
    assert "MSG_SIZE_TOO_LARGE" in failures["error_class"]
    # An event written now is after the relay's cursor: unsent, and PENDING.
    publish_numbered(topic, "fine", 3)
    assert counts() == {"PENDING": 2, "FAILED": 2, "DONE": 3}

    settings.OUTBOX = {**settings.OUTBOX, "PRODUCER_CONFIG": {}}
    close_producers()
    outbox_event_discard(event=other_big)
    outbox_event_retry(event=big)
    assert counts() == {"PENDING": 3, "FAILED": 0, "DONE": 3}
    assert size_limited_log_relay.run().published == 3  # big, the one behind it, late

    # The discarded event is in none of the exact counts.
    assert counts() == {"PENDING": 0, "FAILED": 0, "DONE": 6}
    assert outbox_oldest_pending_age_seconds() is None
    assert held_keys() == []
    assert failures_by_error_class() == []
    assert sum(rate_series(period=timedelta(hours=1), bucket=timedelta(minutes=1)).published) == 6
