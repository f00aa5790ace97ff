"""What the outbox and inbox detail pages share to show times and attempt histories: times
to the millisecond in UTC, and the table of a row's attempts, oldest first, cut at
ATTEMPTS_SHOWN with a pointer to the API, which pages through them all."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join

# A detail page lists at most this many attempts; the API pages through them all.
ATTEMPTS_SHOWN = 200

_CELL = "<td style='padding:2px 12px 2px 0; vertical-align:top'>{}</td>"
_HEADING = "<th style='text-align:left'>{}</th>"


def millis(moment: datetime) -> str:
    """An instant as ISO 8601 to the millisecond, in UTC (what the database stores)."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


def attempts_table(
    *,
    columns: Sequence[str],
    lines: Sequence[Sequence[Any]],
    more: bool,
    api_view: str,
    pk: Any,
    note: str = "",
) -> str:
    """The table of a row's attempts: `lines` (one cell per column each, at most
    ATTEMPTS_SHOWN of them; `more` when there are others), a `note` under it, and, when some
    are not shown, where the API's `api_view` lists them all (if the project mounts the API)."""
    if not lines:
        return format_html("<p>No attempt yet.</p>{}", note) if note else "No attempt yet."
    body = format_html_join("", "<tr>" + _CELL * len(columns) + "</tr>", lines)
    headings = format_html_join("", _HEADING, ((column,) for column in columns))
    rest = _the_rest_in_the_api(len(lines), api_view, pk) if more else ""
    return format_html(
        "<table class='console-attempts'><tr>{}</tr>{}</table>{}{}", headings, body, rest, note
    )


def _the_rest_in_the_api(shown: int, api_view: str, pk: Any) -> str:
    try:
        url = reverse(api_view, args=[pk])
    except NoReverseMatch:  # a project that mounts the admin pages without the API
        return format_html("<p>Only the first {} attempts are shown.</p>", shown)
    return format_html(
        "<p>Only the first {} attempts are shown; the API's {} lists them all.</p>", shown, url
    )
