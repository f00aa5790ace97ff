"""The dashboard's charts in headless Chromium: their value axes read as numbers with their
unit (1.2 s), not as JavaScript writes a float sum (1.2000000000000002 s). Chart.js rounds
its ticks to the step's decimals; this holds the charts to it."""

import re
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.analytics.results import result_run
from tests.e2e.conftest import log_in, needs_browser, page_report

pytestmark = needs_browser

# Every tick label of every chart's value axis, once the page has settled.
TICK_LABELS_SCRIPT = """
return [...document.querySelectorAll("canvas")]
    .map((canvas) => window.Chart.getChart(canvas))
    .filter((chart) => chart && chart.scales.y)
    .map((chart) => chart.scales.y.ticks.map((tick) => String(tick.label)));
"""


@pytest.mark.django_db(transaction=True)
def test_the_value_axes_of_the_charts_are_formatted(live_server, browser: Any) -> None:
    from django.core.cache import cache

    cache.clear()
    User.objects.create_superuser("admin", "admin@example.com", "e2e-password-charts")
    # Lags of 0.037 s, 0.074 s...: an axis in steps of 0.2 s, which floats add up to
    # 1.2000000000000002.
    result_run(hours=6, scale=0.037)

    log_in(browser, live_server.url, "admin", "e2e-password-charts")
    browser.get(f"{live_server.url}/admin/")
    report = page_report(browser)
    assert report["violations"] == [], report
    # A browser's own request for /favicon.ico may fail; a script of the page may not.
    assert [error for error in report["script_errors"] if "/favicon.ico" not in error] == []
    axes = browser.execute_script(TICK_LABELS_SCRIPT)
    # Three lag charts (seconds) and the duplicate rate (%); the rate charts have no unit.
    seconds = [labels for labels in axes if labels and labels[-1].endswith(" s")]
    percent = [labels for labels in axes if labels and labels[-1].endswith(" %")]
    assert len(seconds) == 3, axes
    assert len(percent) == 1, axes
    number = re.compile(r"^-?\d+(\.\d{1,3})?( s| %)?$")
    for labels in axes:
        assert all(number.match(label.replace(",", "")) for label in labels), labels
    assert any("." in label for labels in seconds for label in labels), seconds
