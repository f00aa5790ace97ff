"""The outbox events' console: list, detail with the consumers' timeline, repairs, and the
release of a quarantined key. Every action calls console.operations, has its own permission,
and is logged."""

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

from console.admin.base import DeliveryAdmin, ExactTextFilter, run_selected_action
from console.models import OperatorAction
from console.operations import outbox_event_action, outbox_key_release_action
from console.selectors import event_consumers
from outbox.models import OutboxEvent, OutboxEventPermission

Action = OperatorAction.Action


@admin.register(OutboxEvent)
class OutboxEventAdmin(DeliveryAdmin):
    permissions = OutboxEventPermission
    retry_action = Action.OUTBOX_RETRY
    row_noun = "event"

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
    search_fields = ("id", "aggregate_id", "key")
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

    def has_release_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm(OutboxEventPermission.RELEASE_KEY))

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

    @display(description="Inbox rows with this event id, in every consumer group")
    def timeline(self, event: OutboxEvent) -> str:
        rows = event_consumers(event_id=event.id)
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

    def run_row_action(self, request: HttpRequest, row: Any, name: str) -> OutboxEvent:
        return outbox_event_action(user=request.user, event=row, action=name, source="admin")

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
