"""The outbox console: events (list, detail with the consumers' timeline, repairs), and the
operators' audit log. Every action calls a service, has its own permission, and is logged."""

import contextlib
import uuid
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from unfold.contrib.filters.admin import RangeDateTimeFilter
from unfold.decorators import action, display

from inbox.errors import InboxError
from inbox.models import InboxMessage
from outbox.errors import OutboxError
from outbox.models import OperatorAction, OutboxEvent
from project.console_admin import (
    EstimatedCountPaginator,
    ExactTextFilter,
    ReadOnlyModelAdmin,
    bulk_matching_view,
    detail_action_confirmation,
    preformatted,
    pretty_json,
    run_selected_action,
    status_badge,
)
from project.operations import (
    ConsoleError,
    outbox_event_action,
    outbox_key_release_action,
)

Action = OperatorAction.Action


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyModelAdmin):
    list_display = (
        "event_id",
        "event_type",
        "aggregate",
        "topic",
        "state",
        "attempts",
        "created_at",
        "published_at",
    )
    list_filter = (
        "status",
        ("event_type", ExactTextFilter),
        ("aggregate_type", ExactTextFilter),
        ("topic", ExactTextFilter),
        ("created_at", RangeDateTimeFilter),
        ("published_at", RangeDateTimeFilter),
    )
    list_filter_submit = True
    search_fields = ("id", "aggregate_id", "key")
    search_help_text = "An event id, an aggregate id or a key (exact)."
    # Never COUNT(*) the whole table; see EstimatedCountPaginator.
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    # Unfold renders a row in a few milliseconds: 25 rows keep a page well under 300 ms.
    list_per_page = 25
    ordering = ("-created_at",)
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
            {"fields": ("id", "event_type", "aggregate_type", "aggregate_id", "topic", "key")},
        ),
        (
            "Delivery",
            {
                "fields": (
                    "state",
                    "attempts",
                    "next_attempt_at",
                    "last_error_text",
                    "created_at",
                    "published_at",
                    "kafka_partition",
                    "kafka_offset",
                    "position",
                    "discarded_at",
                )
            },
        ),
        ("Payload and headers", {"fields": ("payload_json", "headers_json")}),
        ("Timeline: consumers of this event", {"fields": ("timeline",)}),
    )

    def has_retry_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm("outbox.retry_outboxevent"))

    def has_discard_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm("outbox.discard_outboxevent"))

    def has_replay_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm("outbox.replay_outboxevent"))

    def has_release_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm("outbox.release_outboxkey"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboxEvent]:
        events = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            events = events.defer("payload", "headers")
        return events

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        # Exact matches only, each served by an index; icontains would scan millions of rows.
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(aggregate_id=term) | Q(key=term)
        with contextlib.suppress(ValueError):
            condition |= Q(id=uuid.UUID(term))
        return queryset.filter(condition), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = {
            **(extra_context or {}),
            "can_retry_matching": self.has_retry_permission(request),
        }
        return super().changelist_view(request, extra_context)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "retry-matching/",
                self.admin_site.admin_view(self.retry_matching_view),
                name="outbox_outboxevent_retry_matching",
            ),
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
    def state(self, event: OutboxEvent) -> str:
        return status_badge(event.status, discarded=event.discarded_at is not None)

    @display(description="Last error")
    def last_error_text(self, event: OutboxEvent) -> str:
        return preformatted(event.last_error)

    @display(description="Payload")
    def payload_json(self, event: OutboxEvent) -> str:
        return pretty_json(event.payload)

    @display(description="Headers")
    def headers_json(self, event: OutboxEvent) -> str:
        return pretty_json(event.headers)

    @display(description="Inbox rows with this event id, in every consumer group")
    def timeline(self, event: OutboxEvent) -> str:
        rows = (
            InboxMessage.objects.filter(event_id=str(event.id))
            .defer("payload", "headers", "raw_value")
            .order_by("received_at")
        )
        steps = [
            ("created", event.created_at, "", ""),
            (
                "published",
                event.published_at,
                "",
                f"partition {event.kafka_partition}, offset {event.kafka_offset}"
                if event.published_at
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
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.OUTBOX_RETRY, "Retry")

    @action(description="Discard selected FAILED events (kept for audit)", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.OUTBOX_DISCARD, "Discard")

    @action(description="Replay selected events with the same event id", permissions=["replay"])
    def replay_same_id(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.OUTBOX_REPLAY, "Replay (same id)")

    @action(description="Replay selected events with a new event id", permissions=["replay"])
    def replay_new_id(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.OUTBOX_REPLAY_NEW_ID, "Replay (new id)")

    # --- detail actions ------------------------------------------------------------------------

    def _detail(self, request: HttpRequest, object_id: str, name: str, verb: str) -> HttpResponse:
        # get_object answers None for a malformed id as for a missing one.
        event = self.get_object(request, object_id)
        if event is None:
            self.message_user(request, f"No event with the id {object_id!r}.", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:outbox_outboxevent_changelist"))
        confirmation = detail_action_confirmation(self, request, event, verb=verb)
        if confirmation is not None:
            return confirmation
        url = reverse("admin:outbox_outboxevent_change", args=[event.pk])
        try:
            result = outbox_event_action(
                user=request.user, event=event, action=name, source="admin"
            )
        except (OutboxError, InboxError, ConsoleError) as error:
            self.message_user(request, str(error), messages.ERROR)
            return HttpResponseRedirect(url)
        self.message_user(
            request, f"{verb}: event {result.pk} is {result.status}.", messages.SUCCESS
        )
        return HttpResponseRedirect(reverse("admin:outbox_outboxevent_change", args=[result.pk]))

    @action(description="Retry", url_path="retry", permissions=["retry"])
    def retry_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._detail(request, object_id, Action.OUTBOX_RETRY, "Retry")

    @action(description="Discard", url_path="discard", permissions=["discard"])
    def discard_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._detail(request, object_id, Action.OUTBOX_DISCARD, "Discard")

    @action(description="Replay (same event id)", url_path="replay-same-id", permissions=["replay"])
    def replay_same_id_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._detail(
            request, object_id, Action.OUTBOX_REPLAY, "Replay with the same event id"
        )

    @action(description="Replay (new event id)", url_path="replay-new-id", permissions=["replay"])
    def replay_new_id_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._detail(
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

    def retry_matching_view(self, request: HttpRequest) -> HttpResponse:
        return bulk_matching_view(
            self,
            request,
            action=Action.OUTBOX_RETRY,
            permission_check=self.has_retry_permission,
            verb="Retry",
        )

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
        waiting = OutboxEvent.objects.filter(topic=topic, key=key).exclude(
            status=OutboxEvent.Status.DONE
        )
        context = {
            **self.admin_site.each_context(request),
            "title": "Release a quarantined key",
            "opts": self.model._meta,
            "topic": topic,
            "key": key,
            "failed": waiting.filter(
                status=OutboxEvent.Status.FAILED, discarded_at__isnull=True
            ).count(),
            "waiting": waiting.filter(discarded_at__isnull=True).count(),
        }
        return TemplateResponse(request, "admin/console/release_key.html", context)


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyModelAdmin):
    """The audit log: read-only, for everyone with its view permission."""

    list_display = (
        "created_at",
        "username",
        "action",
        "model",
        "source",
        "requested",
        "changed",
        "chunks_pending",
        "short_note",
    )
    list_filter = ("action", "source", ("created_at", RangeDateTimeFilter))
    list_filter_submit = True
    search_fields = ("username",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    readonly_fields = (
        "created_at",
        "user",
        "username",
        "action",
        "model",
        "source",
        "requested",
        "changed",
        "chunks_pending",
        "filters",
        "object_ids",
        "note",
    )

    @display(description="Note")
    def short_note(self, entry: OperatorAction) -> str:
        return entry.note[:80]
