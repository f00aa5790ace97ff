"""The outbox events' console: list, detail with the delivery attempts and the consumers'
timeline, repairs, and the release of a quarantined key. Every action calls
console.operations, has its own permission, and is logged.

Status, attempts, error, publication and discard are the delivery as users see it
(outbox.selectors.outbox_events_with_delivery): the relay never updates an event row, it
appends delivery records and holds a failed key's events in its held set."""

import contextlib
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import EMPTY_VALUES
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from unfold.contrib.filters.admin import RangeDateTimeFilter
from unfold.dataclasses import UnfoldAction
from unfold.decorators import action, display
from unfold.utils import parse_datetime_str

from console.admin.attempts import ATTEMPTS_SHOWN, attempts_table, millis
from console.admin.base import (
    DeliveryAdmin,
    EstimatedCountPaginator,
    ExactTextFilter,
    error_class_filter,
    lag_text,
    log_position_text,
    once_per_row,
    preformatted,
    run_selected_action,
    status_badge,
)
from console.models import OperatorAction
from console.operations import outbox_event_action, outbox_key_release_action
from console.selectors import event_consumers, outbox_event_attempts
from outbox.models import OutboxDelivery, OutboxEvent, OutboxEventPermission, OutboxHeldEvent
from outbox.selectors import (
    DISCARDED,
    WAITING_FOR_OPERATOR,
    outbox_event_delivered,
    outbox_events_in_state,
    outbox_events_published,
    outbox_events_with_delivery,
)

Action = OperatorAction.Action
Status = OutboxEvent.Status


class DeliveryStatusFilter(admin.SimpleListFilter):
    """The status as users see it (delivery_status), or the events an operator discarded.
    The parameter keeps the name of the filter on the event row's column it replaced, so saved
    links and the filters kept in the audit log keep their meaning."""

    title = "status"
    parameter_name = "status__exact"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, str]]:
        return [
            *Status.choices,
            (DISCARDED, "Discarded"),
            (WAITING_FOR_OPERATOR, "Failed, waiting for an operator"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value is None:
            return queryset
        if value not in {choice for choice, _ in self.lookup_choices}:
            return queryset.none()  # as the column's filter answered an unknown status
        return outbox_events_in_state(queryset, state=value)


class DeliveredAtRangeFilter(admin.ListFilter):
    """A range of when the broker confirmed the event's latest publication (delivered_at), in
    the form of unfold's date and time range filter. The event row has no such column: the
    parameters (published_at_from_0 ...) are those of the filter on the row's column it
    replaced, so saved links and the filters kept in the audit log keep their meaning."""

    title = "published at"
    parameter_name = "published_at"
    template = RangeDateTimeFilter.template
    form_class = RangeDateTimeFilter.form_class

    def __init__(
        self, request: HttpRequest, params: dict[str, Any], model: Any, model_admin: Any
    ) -> None:
        super().__init__(request, params, model, model_admin)
        for name in self._parameters():
            if name in params:
                value = params.pop(name)
                self.used_parameters[name] = value[-1] if isinstance(value, list) else value

    def _parameters(self) -> list[str]:
        return [f"{self.parameter_name}_{end}_{part}" for end in ("from", "to") for part in (0, 1)]

    def expected_parameters(self) -> list[str | None]:
        return list(self._parameters())

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:
        yield {
            "request": self.request,
            "parameter_name": self.parameter_name,
            "form": self.form_class(
                name=self.parameter_name,
                data={name: self.used_parameters.get(name) for name in self._parameters()},
            ),
        }

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        bounds: dict[str, datetime] = {}
        for end, lookup in (("from", "gte"), ("to", "lte")):
            day = self.used_parameters.get(f"{self.parameter_name}_{end}_0")
            time = self.used_parameters.get(f"{self.parameter_name}_{end}_1")
            if day in EMPTY_VALUES or time in EMPTY_VALUES:
                continue
            moment = parse_datetime_str(f"{day} {time}")
            if moment is None:
                return None
            if timezone.is_naive(moment):
                moment = timezone.make_aware(moment)
            bounds[lookup] = moment
        if not bounds:
            return queryset
        try:
            return outbox_events_published(queryset, **bounds)
        except (ValueError, ValidationError):
            return None


class OutboxEventPaginator(EstimatedCountPaginator):
    # An event's day partition and its place in commit order: the relay's B-tree index.
    row_place = ("created_at", "transaction_id", "position")


@admin.register(OutboxEvent)
class OutboxEventAdmin(DeliveryAdmin):
    permissions = OutboxEventPermission
    retry_action = Action.OUTBOX_RETRY
    discard_action = Action.OUTBOX_DISCARD
    failure_side = "outbox"
    # The failure groups hold the FAILED events no operator has discarded; so do the lists and
    # the retry and discard their links lead to.
    failure_group_status = WAITING_FOR_OPERATOR
    row_noun = "event"
    paginator = OutboxEventPaginator

    list_display = (
        "event_id",
        "event_type",
        "aggregate",
        "topic",
        "state",
        "attempts_made",
        "created_at",
        "published",
        "publish_lag",
        "log_position",
    )
    list_filter = (
        DeliveryStatusFilter,
        ("event_type", ExactTextFilter),
        ("aggregate_type", ExactTextFilter),
        ("topic", ExactTextFilter),
        ("created_at", RangeDateTimeFilter),
        DeliveredAtRangeFilter,
        # The error as users see it: the held head's, else the latest failed try's.
        error_class_filter("delivery_error"),
    )
    search_fields = ("id", "key")
    search_help_text = (
        "An event id or a key (exact). The key is the aggregate id unless the publisher chose "
        "another."
    )
    # Newest first, by the relay's index (outbox.models.OutboxEvent.Meta).
    ordering = ("-transaction_id", "-position")
    actions = ("retry_selected", "discard_selected", "replay_same_id", "replay_new_id")
    actions_detail = (
        "retry_detail",
        "discard_detail",
        "replay_same_id_detail",
        "replay_new_id_detail",
        "release_key_detail",
    )
    fieldsets = (
        (
            "Event",
            {
                "fields": (
                    "id",
                    "event_type",
                    "aggregate_type",
                    "aggregate_id",
                    "topic",
                    "key",
                    "trace",
                )
            },
        ),
        (
            "Delivery",
            {
                "fields": (
                    "state",
                    "attempts_made",
                    "next_attempt",
                    "last_error_text",
                    "created_at",
                    "published",
                    "partition",
                    "offset",
                    "position",
                    "discarded",
                )
            },
        ),
        ("Delivery attempts", {"fields": ("held", "attempt_history")}),
        ("Payload and headers", {"fields": ("payload_json", "headers_json")}),
        ("Timeline: consumers of this event", {"fields": ("timeline",)}),
    )

    def has_release_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm(OutboxEventPermission.RELEASE_KEY))

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return outbox_events_with_delivery(super().get_queryset(request))

    def get_actions_detail(self, request: HttpRequest, object_id: Any) -> list[UnfoldAction]:
        """The detail page offers the repairs the event's delivery allows; the others would
        only be refused (a request made anyway gets the service's message)."""
        offered = super().get_actions_detail(request, object_id)
        event = self.get_object(request, str(object_id))
        if event is None:
            return offered
        done = event.delivery_status == Status.DONE
        discarded = event.delivery_discarded_at is not None
        failed = event.delivery_status == Status.FAILED and not discarded
        backing_off = event.delivery_status == Status.PENDING and event.delivery_attempts > 0
        allowed = {
            "retry_detail": failed or (backing_off and not discarded),
            "discard_detail": failed,
            "replay_same_id_detail": done or discarded,
            "replay_new_id_detail": done or discarded,
        }
        prefix = f"{self.opts.app_label}_{self.opts.model_name}_"
        return [
            unfold_action
            for unfold_action in offered
            if allowed.get(unfold_action.action_name.removeprefix(prefix), True)
        ]

    def row_status(self, row: Any) -> str:
        discarded = " (discarded)" if row.delivery_discarded_at is not None else ""
        return f"{row.delivery_status}{discarded}"

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        # Exact matches only, each served by an index; icontains would scan millions of rows.
        # The key is the aggregate's id unless the publisher chose another.
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(key=term)
        with contextlib.suppress(ValueError):
            condition |= Q(id=uuid.UUID(term))
        return queryset.filter(condition), False

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "release-key/",
                self.admin_site.admin_view(self.release_key_view),
                name="outbox_outboxevent_release_key",
            ),
            *super().get_urls(),
        ]

    # --- columns and fields ------------------------------------------------------------------

    @display(description="Event id")
    def event_id(self, event: OutboxEvent) -> str:
        return str(event.id)

    @display(description="Aggregate")
    def aggregate(self, event: OutboxEvent) -> str:
        return f"{event.aggregate_type} {event.aggregate_id}"

    @display(description="Status")
    def state(self, event: Any) -> str:
        return status_badge(
            event.delivery_status, discarded=event.delivery_discarded_at is not None
        )

    @display(description="Attempts")
    def attempts_made(self, event: Any) -> int:
        return int(event.delivery_attempts)

    @display(description="Last error")
    def last_error_text(self, event: Any) -> str:
        return preformatted(event.delivery_error)

    @display(description="Published at")
    def published(self, event: Any) -> datetime | None:
        return event.delivered_at

    @display(description="Publish lag")
    def publish_lag(self, event: Any) -> str:
        return lag_text(event.created_at, event.delivered_at)

    @display(description="Partition/offset")
    def log_position(self, event: Any) -> str:
        return log_position_text(event.delivered_partition, event.delivered_offset)

    @display(description="Kafka partition")
    def partition(self, event: Any) -> int | None:
        return event.delivered_partition

    @display(description="Kafka offset")
    def offset(self, event: Any) -> int | None:
        return event.delivered_offset

    @display(description="Discarded at")
    def discarded(self, event: Any) -> datetime | None:
        return event.delivery_discarded_at

    @once_per_row
    def held_row(self, event: Any) -> OutboxHeldEvent | None:
        return OutboxHeldEvent.objects.filter(event_id=event.pk).first()

    @display(description="Next attempt")
    def next_attempt(self, event: Any) -> Any:
        # The relay never updates the row: its retries are planned in the held set.
        held = self.held_row(event)
        return _next_attempt_text(held) if held is not None else "-"

    @display(description="Held back")
    @once_per_row
    def held(self, event: Any) -> str:
        held = self.held_row(event)
        if held is None:
            return "-"
        rows: list[tuple[str, Any]] = [
            ("Held since", millis(held.held_at)),
            ("Next attempt", _next_attempt_text(held)),
        ]
        head = (
            # The shard too: the held set's index of a key's order begins with it.
            OutboxHeldEvent.objects.filter(shard=held.shard, topic=held.topic, key=held.key)
            .order_by("position")
            .only("event_id")
            .first()
        )
        if head is not None and head.event_id != held.event_id:
            url = reverse("admin:outbox_outboxevent_change", args=[head.event_id])
            rows.append(
                (
                    "Waits behind",
                    format_html(
                        '<a href="{}">event {}</a>, the first held event of its key',
                        url,
                        head.event_id,
                    ),
                )
            )
        return format_html(
            "<table class='console-held'>{}</table>",
            format_html_join(
                "",
                "<tr><td style='padding:2px 12px 2px 0'><b>{}</b></td><td>{}</td></tr>",
                rows,
            ),
        )

    @display(description="Delivery attempts, oldest first")
    @once_per_row
    def attempt_history(self, event: Any) -> str:
        # Annotated with error_class by the selector.
        records: list[Any] = list(outbox_event_attempts(event)[: ATTEMPTS_SHOWN + 1])
        lines = [
            (
                millis(record.published_at),
                record.outcome,
                _duration_text(record),
                f"partition {record.kafka_partition}, offset {record.kafka_offset}"
                if record.kafka_partition is not None
                else "-",
                record.relay,
                record.error_class or "-",
                preformatted(record.error),
            )
            for record in records[:ATTEMPTS_SHOWN]
        ]
        return attempts_table(
            columns=("When", "Outcome", "Duration", "Placement", "Relay", "Error class", "Error"),
            lines=lines,
            more=len(records) > ATTEMPTS_SHOWN,
            api_view="outbox-event-attempts",
            pk=event.pk,
        )

    @display(description="Inbox rows with this event id, in every consumer group")
    @once_per_row
    def timeline(self, event: Any) -> str:
        rows = event_consumers(event_id=event.id)
        steps = [
            ("created", event.created_at, "", ""),
            (
                "published",
                event.delivered_at,
                "",
                f"partition {event.delivered_partition}, offset {event.delivered_offset}"
                if event.delivered_at
                else "",
            ),
        ]
        lines = [
            (label, when.isoformat() if when else "-", group, detail)
            for label, when, group, detail in steps
        ]
        for message in rows:
            url = reverse("admin:inbox_inboxmessage_change", args=[message.pk])
            detail = (
                f"{message.status}, attempts {message.attempts}, duplicates "
                f"{message.duplicate_count}, partition {message.partition} offset {message.offset}"
            )
            lines.append(
                ("received", message.received_at.isoformat(), message.consumer_group, detail)
            )
            if message.processed_at:
                lines.append(
                    (
                        "processed",
                        message.processed_at.isoformat(),
                        message.consumer_group,
                        format_html('<a href="{}">message {}</a>', url, message.pk),
                    )
                )
            else:
                lines.append(
                    (
                        "not processed",
                        "-",
                        message.consumer_group,
                        format_html('<a href="{}">message {}</a>', url, message.pk),
                    )
                )
        if not rows:
            lines.append(("consumed", "-", "", "no consumer group has recorded this event yet"))
        body = format_html_join(
            "",
            "<tr><td style='padding:2px 12px 2px 0'><b>{}</b></td><td style='padding:2px 12px 2px "
            "0'>{}</td><td style='padding:2px 12px 2px 0'>{}</td><td>{}</td></tr>",
            lines,
        )
        return format_html(
            "<table class='console-timeline'><tr><th style='text-align:left'>Step</th>"
            "<th style='text-align:left'>When</th><th style='text-align:left'>Group</th>"
            "<th style='text-align:left'>Detail</th></tr>{}</table>",
            body,
        )

    # --- list actions --------------------------------------------------------------------------

    @action(description="Retry selected events", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return run_selected_action(self, request, queryset, Action.OUTBOX_RETRY, "Retry")

    @action(description="Discard selected FAILED events (kept for audit)", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return run_selected_action(self, request, queryset, Action.OUTBOX_DISCARD, "Discard")

    @action(description="Replay selected events with the same event id", permissions=["replay"])
    def replay_same_id(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return run_selected_action(
            self, request, queryset, Action.OUTBOX_REPLAY, "Replay (same id)"
        )

    @action(description="Replay selected events with a new event id", permissions=["replay"])
    def replay_new_id(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return run_selected_action(
            self, request, queryset, Action.OUTBOX_REPLAY_NEW_ID, "Replay (new id)"
        )

    # --- detail actions ------------------------------------------------------------------------

    def run_row_action(self, request: HttpRequest, row: Any, name: str) -> OutboxEvent:
        result = outbox_event_action(user=request.user, event=row, action=name, source="admin")
        # Read again with its delivery: the repair changed the held set and the delivery
        # records, not the row, and a replay with a new event id returns a new row.
        return outbox_event_delivered(event_id=result.pk)

    @action(description="Retry", url_path="retry", permissions=["retry"])
    def retry_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self.detail_action(request, object_id, Action.OUTBOX_RETRY, "Retry")

    @action(description="Discard", url_path="discard", permissions=["discard"])
    def discard_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self.detail_action(request, object_id, Action.OUTBOX_DISCARD, "Discard")

    @action(description="Replay (same event id)", url_path="replay-same-id", permissions=["replay"])
    def replay_same_id_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self.detail_action(
            request, object_id, Action.OUTBOX_REPLAY, "Replay with the same event id"
        )

    @action(description="Replay (new event id)", url_path="replay-new-id", permissions=["replay"])
    def replay_new_id_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self.detail_action(
            request, object_id, Action.OUTBOX_REPLAY_NEW_ID, "Replay with a new event id"
        )

    @action(description="Release this event's key", url_path="release-key", permissions=["release"])
    def release_key_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        event = self.get_object(request, object_id)
        if event is None:
            return HttpResponseRedirect(reverse("admin:outbox_outboxevent_changelist"))
        url = reverse("admin:outbox_outboxevent_release_key")
        return HttpResponseRedirect(f"{url}?{urlencode({'topic': event.topic, 'key': event.key})}")

    # --- views ---------------------------------------------------------------------------------

    def release_key_view(self, request: HttpRequest) -> HttpResponse:
        """Confirms, then releases a quarantined (topic, key): its FAILED events are
        discarded and a backing-off event becomes due, so the key's later events flow."""
        if not self.has_release_permission(request):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        topic, key = source.get("topic", ""), source.get("key", "")
        if request.method == "POST":
            record = outbox_key_release_action(
                user=request.user,
                topic=topic,
                key=key,
                source="admin",
                note=request.POST.get("note", "")[:2000],
            )
            self.message_user(
                request,
                f"Released key {key!r} of topic {topic!r}: {record.changed} events changed "
                f"(audit #{record.pk}).",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(reverse("admin:index"))
        waiting = _undelivered_of_key(topic=topic, key=key)
        context = {
            **self.admin_site.each_context(request),
            "title": "Release a quarantined key",
            "opts": self.model._meta,
            "topic": topic,
            "key": key,
            "failed": waiting.filter(delivery_status=Status.FAILED).count(),
            "waiting": waiting.count(),
        }
        return TemplateResponse(request, "admin/console/release_key.html", context)


def _undelivered_of_key(*, topic: str, key: str) -> QuerySet:
    """The events of (topic, key) neither delivered nor discarded, by their delivery.

    Only candidates are annotated, not every event the key ever had: the held events. A key's
    undelivered events are held behind its failed head, and a later event joins them when the
    relay reads it."""
    held = OutboxHeldEvent.objects.filter(topic=topic, key=key).values("event_id")
    events = OutboxEvent.objects.filter(pk__in=held, topic=topic, key=key)
    return (
        outbox_events_with_delivery(events)
        .exclude(delivery_status=Status.DONE)
        .filter(delivery_discarded_at__isnull=True)
    )


def _next_attempt_text(held: OutboxHeldEvent) -> Any:
    if held.next_attempt_at is not None:
        return millis(held.next_attempt_at)
    if held.attempts > 0:
        return f"waiting for an operator ({held.attempts} attempts spent)"
    return "after the events before it in its key"


def _duration_text(record: OutboxDelivery) -> str:
    if record.outcome == OutboxDelivery.Outcome.DISCARDED:
        return "-"  # an operator's decision, not a try
    if record.duration_ms is None:
        return "unknown"  # written before the relay kept durations (migration 0018)
    return f"{record.duration_ms} ms"
