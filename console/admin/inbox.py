"""The inbox messages' console: messages of every consumer group, their payloads and errors,
and the operators' retry, replay and discard. Every action calls console.operations, has its
own permission, and is written to the audit log."""

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from unfold.contrib.filters.admin import RangeDateTimeFilter
from unfold.decorators import action, display

from console.admin.base import (
    DeliveryAdmin,
    ExactTextFilter,
    run_selected_action,
)
from console.models import OperatorAction
from console.operations import inbox_message_action
from inbox.models import InboxMessage, InboxMessagePermission
from outbox.models import OutboxEvent

Action = OperatorAction.Action


@admin.register(InboxMessage)
class InboxMessageAdmin(DeliveryAdmin):
    permissions = InboxMessagePermission
    retry_action = Action.INBOX_RETRY
    deferred_on_list = ("payload", "headers", "raw_value")
    row_noun = "message"

    list_display = (
        "id",
        "event_id",
        "consumer_group",
        "event_type",
        "topic",
        "state",
        "attempts",
        "duplicate_count",
        "received_at",
        "processed_at",
    )
    list_filter = (
        "status",
        ("consumer_group", ExactTextFilter),
        ("event_type", ExactTextFilter),
        ("aggregate_type", ExactTextFilter),
        ("topic", ExactTextFilter),
        ("received_at", RangeDateTimeFilter),
        ("processed_at", RangeDateTimeFilter),
    )
    search_fields = ("event_id", "aggregate_id", "key")
    ordering = ("-received_at",)
    actions = ("retry_selected", "replay_selected", "discard_selected")
    actions_detail = ("retry_detail", "replay_detail", "discard_detail")
    fieldsets = (
        (
            "Message",
            {
                "fields": (
                    "event_id",
                    "outbox_event",
                    "consumer_group",
                    "event_type",
                    "aggregate_type",
                    "aggregate_id",
                )
            },
        ),
        (
            "Kafka",
            {"fields": ("topic", "partition", "offset", "key", "published_at")},
        ),
        (
            "Processing",
            {
                "fields": (
                    "state",
                    "attempts",
                    "next_attempt_at",
                    "last_error_text",
                    "received_at",
                    "processed_at",
                    "duplicate_count",
                    "last_duplicate_at",
                    "discarded_at",
                )
            },
        ),
        (
            "Payload and headers",
            {"fields": ("payload_json", "headers_json", "raw_value", "raw_value_encoding")},
        ),
    )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(event_id=term) | Q(aggregate_id=term) | Q(key=term)), False

    @display(description="Outbox event")
    def outbox_event(self, message: InboxMessage) -> str:
        event_id = _as_uuid(message.event_id)
        event = OutboxEvent.objects.filter(pk=event_id).only("pk").first() if event_id else None
        if event is None:
            return "not in this database's outbox"
        url = reverse("admin:outbox_outboxevent_change", args=[event.pk])
        return format_html('<a href="{}">{} (timeline)</a>', url, event.pk)

    @action(description="Retry selected messages now", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.INBOX_RETRY, "Retry")

    @action(description="Replay selected FAILED messages", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.INBOX_REPLAY, "Replay")

    @action(description="Discard selected FAILED messages (kept)", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.INBOX_DISCARD, "Discard")

    def run_row_action(self, request: HttpRequest, row: Any, name: str) -> InboxMessage:
        return inbox_message_action(user=request.user, message=row, action=name, source="admin")

    @action(description="Retry now", url_path="retry", permissions=["retry"])
    def retry_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self.detail_action(request, object_id, Action.INBOX_RETRY, "Retry now")

    @action(description="Replay", url_path="replay", permissions=["replay"])
    def replay_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self.detail_action(request, object_id, Action.INBOX_REPLAY, "Replay")

    @action(description="Discard", url_path="discard", permissions=["discard"])
    def discard_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self.detail_action(request, object_id, Action.INBOX_DISCARD, "Discard")


def _as_uuid(value: str) -> str | None:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None
