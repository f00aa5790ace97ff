"""The console benchmark's filter rows: every filter of the outbox and inbox lists, in the API
and in the admin, with a value that matches nothing, one that matches few rows and one that
matches many, alone and with a status. tests/console/test_filter_benchmark.py fails when a
list gains a filter that has no row here.

A value is a query string with placeholders that the data set fills (FilterSample): its
newest creation time decides the time ranges, its rows the ids.
"""

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

# What a value matches, in the order the rows are printed.
NOTHING = "none"
FEW = "few"
MANY = "many"


@dataclass(frozen=True)
class FilterSample:
    """The values the placeholders stand for, read from the data set."""

    newest: datetime  # the newest event's creation time
    event_id: str  # an outbox event (a FAILED head)
    message_id: int  # an inbox message
    message_event_id: str  # that message's event id

    def placeholders(self) -> dict[str, str]:
        times = {
            # After every row, before every row; the first and the last minute of the rows.
            "after_all": self.newest + timedelta(days=1),
            "before_all": self.newest - timedelta(days=8),
            "last_minute": self.newest - timedelta(minutes=1),
            "first_minute_end": self.newest - timedelta(days=7) + timedelta(minutes=1),
        }
        values: dict[str, str] = {
            "event_id": self.event_id,
            "message_id": str(self.message_id),
            "message_event_id": self.message_event_id,
            "unknown_uuid": str(uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF, version=4)),
        }
        for name, moment in times.items():
            values[name] = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
            values[f"{name}_date"] = moment.strftime("%Y-%m-%d")
            values[f"{name}_time"] = moment.strftime("%H:%M:%S")
        return values


@dataclass(frozen=True)
class FilterRows:
    """One list's filters: its path, how it is filtered by status, and per filter (by the name
    the coverage test reads from the list) the query strings of its values."""

    name: str
    path: str
    status_parameter: str
    statuses: tuple[str, ...]
    filters: dict[str, dict[str, str]]

    def queries(self) -> list[tuple[str, str, str]]:
        """(filter, what the value matches, query string) of every row: each value alone, each
        value with the rarest status (FAILED), the value that matches few with each other
        status; and each status alone."""
        rows = [("status", status, f"{self.status_parameter}={status}") for status in self.statuses]
        for name, values in self.filters.items():
            if not values:  # the status, above
                continue
            for matches, query in values.items():
                rows.append((name, matches, query))
            for matches, query in values.items():
                rows.append((name, f"{matches}, FAILED", f"{query}&{self.status_parameter}=FAILED"))
            few = values.get(FEW) or next(iter(values.values()))
            for status in self.statuses:
                if status != "FAILED":
                    rows.append((name, f"few, {status}", f"{few}&{self.status_parameter}={status}"))
        return rows


def _api_times(name: str) -> dict[str, str]:
    """A time filter of the API: `<field>_after` or `<field>_before`."""
    if name.endswith("_after"):
        return {
            NOTHING: f"{name}={{after_all}}",
            FEW: f"{name}={{last_minute}}",
            MANY: f"{name}={{before_all}}",
        }
    return {
        NOTHING: f"{name}={{before_all}}",
        FEW: f"{name}={{first_minute_end}}",
        MANY: f"{name}={{after_all}}",
    }


def _admin_range(field: str) -> dict[str, str]:
    """An admin date-time range filter (a date and a time for each end)."""

    def since(moment: str) -> str:
        return f"{field}_from_0={{{moment}_date}}&{field}_from_1={{{moment}_time}}"

    def until(moment: str) -> str:
        return f"{field}_to_0={{{moment}_date}}&{field}_to_1={{{moment}_time}}"

    return {
        NOTHING: since("after_all"),
        FEW: since("last_minute"),
        MANY: until("after_all"),
        "few, before": until("first_minute_end"),
    }


def _text(name: str, few: str, many: str | None = None) -> dict[str, str]:
    values = {NOTHING: f"{name}=nope", FEW: f"{name}={few}"}
    if many is not None:
        values[MANY] = f"{name}={many}"
    return values


# The console benchmark's data set (benchmarks/console_bench.py): its rare values match one
# event or message in 5,000, its common ones a tenth or more.
OUTBOX_TEXT = {
    "event_type": _text("event_type", "Rare", "Event3"),
    "aggregate_type": _text("aggregate_type", "rare", "agg2"),
    "topic": _text("topic", "bench.rare", "bench.topic2"),
}
INBOX_TEXT = {
    **OUTBOX_TEXT,
    "consumer_group": _text("consumer_group", "nope", "billing"),
}
ERROR_CLASS = {
    "outbox": _text("error_class", "NOT_ENOUGH_REPLICAS", "MSG_TIMED_OUT"),
    "inbox": _text("error_class", "bench.errors.RareError", "bench.errors.HandlerError"),
}

FILTER_LISTS = (
    FilterRows(
        name="api outbox",
        path="/api/outbox/events/",
        status_parameter="status",
        statuses=("PENDING", "DONE", "FAILED"),
        filters={
            "status": {},
            "id": {NOTHING: "id={unknown_uuid}", FEW: "id={event_id}"},
            **OUTBOX_TEXT,
            "aggregate_id": _text("aggregate_id", "agg-4242"),
            "key": _text("key", "agg-4242"),
            "created_after": _api_times("created_after"),
            "created_before": _api_times("created_before"),
            "published_after": _api_times("published_after"),
            "published_before": _api_times("published_before"),
            "discarded": {FEW: "discarded=true", MANY: "discarded=false"},
        },
    ),
    FilterRows(
        name="api inbox",
        path="/api/inbox/messages/",
        status_parameter="status",
        statuses=("PENDING", "DONE", "FAILED"),
        filters={
            "status": {},
            "id": {NOTHING: "id=999999999", FEW: "id={message_id}"},
            "event_id": {NOTHING: "event_id=nope", FEW: "event_id={message_event_id}"},
            **INBOX_TEXT,
            "aggregate_id": _text("aggregate_id", "agg-4242"),
            "key": _text("key", "agg-4242"),
            "received_after": _api_times("received_after"),
            "received_before": _api_times("received_before"),
            "processed_after": _api_times("processed_after"),
            "processed_before": _api_times("processed_before"),
            "discarded": {FEW: "discarded=true", MANY: "discarded=false"},
        },
    ),
    FilterRows(
        name="admin outbox",
        path="/admin/outbox/outboxevent/",
        status_parameter="status__exact",
        statuses=("PENDING", "DONE", "FAILED", "discarded", "waiting"),
        filters={
            "status__exact": {},
            **OUTBOX_TEXT,
            "created_at": _admin_range("created_at"),
            "published_at": _admin_range("published_at"),
            "error_class": ERROR_CLASS["outbox"],
            "q": {NOTHING: "q=nope", FEW: "q=agg-4242", "few, id": "q={event_id}"},
        },
    ),
    FilterRows(
        name="admin inbox",
        path="/admin/inbox/inboxmessage/",
        status_parameter="status__exact",
        statuses=("PENDING", "DONE", "FAILED"),
        filters={
            "status": {},
            **INBOX_TEXT,
            "received_at": _admin_range("received_at"),
            "processed_at": _admin_range("processed_at"),
            "error_class": ERROR_CLASS["inbox"],
            "q": {NOTHING: "q=nope", FEW: "q=agg-4242", "few, id": "q={message_event_id}"},
        },
    ),
)
