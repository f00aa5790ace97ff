"""The inbox console: messages of every consumer group, their payloads and errors, and the
operators' retry and replay. Every action calls a service, has its own permission, and is
written to the audit log (outbox.OperatorAction)."""

from typing import Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from unfold.contrib.filters.admin import RangeDateTimeFilter
from unfold.decorators import action, display

from inbox.errors import InboxError
from inbox.models import InboxMessage
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
from project.operations import ConsoleError, inbox_message_action

Action = OperatorAction.Action


@admin.register(InboxMessage)
class InboxMessageAdmin(ReadOnlyModelAdmin):
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
    list_filter_submit = True
    search_fields = ("event_id", "aggregate_id", "key")
    search_help_text = "An event id, an aggregate id or a key (exact)."
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    # Unfold renders a row in a few milliseconds: 25 rows keep a page well under 300 ms.
    list_per_page = 25
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

    def has_retry_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm("outbox.retry_inboxmessage"))

    def has_replay_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm("outbox.replay_inboxmessage"))

    def has_discard_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm("outbox.discard_inboxmessage"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[InboxMessage]:
        rows = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            rows = rows.defer("payload", "headers", "raw_value")
        return rows

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(event_id=term) | Q(aggregate_id=term) | Q(key=term)), False

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
                name="inbox_inboxmessage_retry_matching",
            ),
            *super().get_urls(),
        ]

    @display(description="Status")
    def state(self, message: InboxMessage) -> str:
        return status_badge(message.status, discarded=message.discarded_at is not None)

    @display(description="Outbox event")
    def outbox_event(self, message: InboxMessage) -> str:
        event_id = _as_uuid(message.event_id)
        event = OutboxEvent.objects.filter(pk=event_id).only("pk").first() if event_id else None
        if event is None:
            return "not in this database's outbox"
        url = reverse("admin:outbox_outboxevent_change", args=[event.pk])
        return format_html('<a href="{}">{} (timeline)</a>', url, event.pk)

    @display(description="Last error")
    def last_error_text(self, message: InboxMessage) -> str:
        return preformatted(message.last_error)

    @display(description="Payload")
    def payload_json(self, message: InboxMessage) -> str:
        return pretty_json(message.payload)

    @display(description="Headers")
    def headers_json(self, message: InboxMessage) -> str:
        return pretty_json(message.headers)

    @action(description="Retry selected messages now", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.INBOX_RETRY, "Retry")

    @action(description="Replay selected FAILED messages", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.INBOX_REPLAY, "Replay")

    @action(description="Discard selected FAILED messages (kept)", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_selected_action(self, request, queryset, Action.INBOX_DISCARD, "Discard")

    def _detail(self, request: HttpRequest, object_id: str, name: str, verb: str) -> HttpResponse:
        # get_object answers None for a malformed id as for a missing one.
        message = self.get_object(request, object_id)
        if message is None:
            self.message_user(request, f"No message with the id {object_id!r}.", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:inbox_inboxmessage_changelist"))
        confirmation = detail_action_confirmation(self, request, message, verb=verb)
        if confirmation is not None:
            return confirmation
        url = reverse("admin:inbox_inboxmessage_change", args=[message.pk])
        try:
            message = inbox_message_action(
                user=request.user, message=message, action=name, source="admin"
            )
        except (InboxError, ConsoleError) as error:
            self.message_user(request, str(error), messages.ERROR)
            return HttpResponseRedirect(url)
        self.message_user(
            request, f"{verb}: message {message.pk} is {message.status}.", messages.SUCCESS
        )
        return HttpResponseRedirect(url)

    @action(description="Retry now", url_path="retry", permissions=["retry"])
    def retry_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._detail(request, object_id, Action.INBOX_RETRY, "Retry now")

    @action(description="Replay", url_path="replay", permissions=["replay"])
    def replay_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._detail(request, object_id, Action.INBOX_REPLAY, "Replay")

    @action(description="Discard", url_path="discard", permissions=["discard"])
    def discard_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._detail(request, object_id, Action.INBOX_DISCARD, "Discard")

    def retry_matching_view(self, request: HttpRequest) -> HttpResponse:
        return bulk_matching_view(
            self,
            request,
            action=Action.INBOX_RETRY,
            permission_check=self.has_retry_permission,
            verb="Retry",
        )


def _as_uuid(value: str) -> str | None:
    import uuid

    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None
