"""The event and message detail pages show the trace of the event's creation context, linked to
the tracing backend by CONSOLE_TRACE_URL_TEMPLATE; a bad template stops start-up (console.E001)."""

import re

import pytest

from console.checks import check_trace_url_template
from outbox.tracing import current_traceparent
from tests.console.conftest import detail_pages

pytestmark = pytest.mark.django_db

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _pages(viewer, make_event, make_message, headers: dict[str, str]) -> list[str]:
    token = current_traceparent.set(headers.get("traceparent"))
    try:
        event = make_event()
    finally:
        current_traceparent.reset(token)
    message = make_message(event_id=str(event.pk), headers=headers)
    return detail_pages(viewer, event, message)


def test_details_link_the_trace_through_the_url_template(
    viewer, make_event, make_message, settings
):
    settings.CONSOLE_TRACE_URL_TEMPLATE = "https://traces.example/zipkin/traces/{trace_id}?a=1&b=2"
    link = (
        f'<a href="https://traces.example/zipkin/traces/{TRACE_ID}?a=1&amp;b=2" '
        f'target="_blank" rel="noopener noreferrer">{TRACE_ID}</a>'
    )
    for html in _pages(viewer, make_event, make_message, {"traceparent": TRACEPARENT}):
        assert link in html


def test_without_a_template_the_trace_id_is_text(viewer, make_event, make_message, settings):
    settings.CONSOLE_TRACE_URL_TEMPLATE = ""
    for html in _pages(viewer, make_event, make_message, {"traceparent": TRACEPARENT}):
        # The whole value of Unfold's read-only box (newer Unfold leaves spaces in its class).
        assert re.search(rf'<div class="readonly [^"]*">{TRACE_ID}</div>', html)
        assert f">{TRACE_ID}</a>" not in html


def test_without_a_trace_context_no_trace_is_shown(viewer, make_event, make_message, settings):
    settings.CONSOLE_TRACE_URL_TEMPLATE = "https://traces.example/{trace_id}"
    for html in _pages(viewer, make_event, make_message, {"traceparent": "00-bad-01"}):
        assert "traces.example" not in html
        assert "Trace" in html


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("https://traces.example/zipkin/", "it has no {trace_id}"),
        ("https://traces.example/{trace_id}/{span_id}", "no placeholder but {trace_id}"),
        ("https://traces.example/{trace_id", "no placeholder but {trace_id}"),
        ("ftp://traces.example/{trace_id}", "not an http:// or https:// URL"),
        ("{trace_id}", "not an http:// or https:// URL"),
    ],
)
def test_a_template_that_cannot_make_a_trace_url_is_a_system_check_error(
    settings, template, problem
):
    settings.CONSOLE_TRACE_URL_TEMPLATE = template
    [error] = check_trace_url_template(None)
    assert error.id == "console.E001"
    assert problem in error.msg


@pytest.mark.parametrize(
    "template",
    ["", "http://127.0.0.1:9411/zipkin/traces/{trace_id}", "https://j.example/trace/{trace_id}"],
)
def test_an_empty_or_good_template_passes_the_check(settings, template):
    settings.CONSOLE_TRACE_URL_TEMPLATE = template
    assert check_trace_url_template(None) == []
