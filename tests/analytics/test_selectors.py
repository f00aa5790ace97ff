"""The result series: for each hour, the latest run that covers the whole hour wins over a
later run of part of it."""

from datetime import UTC, datetime, timedelta

import pytest

from analytics.models import AnalyticsRun, DuplicateStat
from analytics.selectors import duplicate_rate_series

pytestmark = pytest.mark.django_db

TEN = datetime(2026, 11, 20, 10, tzinfo=UTC)


def run_with_rate(start: datetime, end: datetime, *, started: datetime, rates: dict) -> None:
    run = AnalyticsRun.objects.create(
        window_start=start,
        window_end=end,
        status=AnalyticsRun.Status.SUCCEEDED,
        started_at=started,
    )
    for hour, rate in rates.items():
        DuplicateStat.objects.create(
            run=run,
            hour=hour,
            topic="orders",
            consumer_group="billing",
            deliveries=100,
            unique_events=100,
            duplicate_deliveries=int(rate * 100),
            duplicate_rate=rate,
            max_copies=2,
        )


def test_a_later_run_over_part_of_an_hour_does_not_replace_the_whole_hour():
    eleven, twelve = TEN + timedelta(hours=1), TEN + timedelta(hours=2)
    run_with_rate(TEN, twelve, started=twelve, rates={TEN: 0.10, eleven: 0.20})
    # Later, an ad-hoc run of 10:30 to 12:30: part of 10h and 12h, all of 11h.
    run_with_rate(
        TEN + timedelta(minutes=30),
        twelve + timedelta(minutes=30),
        started=twelve + timedelta(hours=1),
        rates={TEN: 0.50, eleven: 0.25, twelve: 0.30},
    )
    series = {stat.hour: stat.duplicate_rate for stat in duplicate_rate_series()}
    # 10h: the whole-hour row; 11h: both cover it, the later run wins; 12h: only the part.
    assert series == {TEN: 0.10, eleven: 0.25, twelve: 0.30}
