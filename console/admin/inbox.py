"""The inbox messages' console: messages of every consumer group, their payloads, errors and
handler attempts, the operators' retry, replay and discard, and the keys held in groups with
order per key (retry the sequence, skip the head, release the key). Every action calls
console.operations, has its own permission, and is written to the audit log."""

import uuid
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from unfold.contrib.filters.admin import RangeDateTimeFilter
from unfold.decorators import action, display

from console.admin.attempts import ATTEMPTS_SHOWN, attempts_table, millis
from console.admin.base import (
    DeliveryAdmin,
    ExactTextFilter,
    error_class_filter,
    lag_text,
    log_position_text,
    once_per_row,
    preformatted,
    run_selected_action,
)
from console.models import OperatorAction
from console.operations import INBOX_KEY_ACTIONS, inbox_key_action, inbox_message_action
from inbox.errors import InvalidTransition
from inbox.models import InboxAttempt, InboxMessage, InboxMessagePermission
from inbox.selectors import inbox_held_keys
from outbox.models import OutboxEvent

Action = OperatorAction.Action


@admin.register(InboxMessage)
class InboxMessageAdmin(DeliveryAdmin):
    permissions = InboxMessagePermission
    retry_action = Action.INBOX_RETRY
    discard_action = Action.INBOX_DISCARD
    failure_side = "inbox"
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
        "consume_lag",
        "log_position",
    )
    list_filter = (
        "status",
        ("consumer_group", ExactTextFilter),
        ("event_type", ExactTextFilter),
        ("aggregate_type", ExactTextFilter),
        ("topic", ExactTextFilter),
        ("received_at", RangeDateTimeFilter),
        ("processed_at", RangeDateTimeFilter),
        error_class_filter("last_error"),
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
                    "trace",
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
                    "released_at",
                )
            },
        ),
        ("Handler attempts", {"fields": ("attempt_history",)}),
        (
            "Payload and headers",
            {"fields": ("payload_json", "headers_json", "raw_value", "raw_value_encoding")},
        ),
    )

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "held-keys/",
                self.admin_site.admin_view(self.held_keys_view),
                name="inbox_inboxmessage_held_keys",
            ),
            path(
                "held-keys/act/",
                self.admin_site.admin_view(self.held_key_action_view),
                name="inbox_inboxmessage_held_key_action",
            ),
            *super().get_urls(),
        ]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(event_id=term) | Q(aggregate_id=term) | Q(key=term)), False

    @display(description="Consume lag")
    def consume_lag(self, message: InboxMessage) -> str:
        return lag_text(message.published_at, message.processed_at)

    @display(description="Partition/offset")
    def log_position(self, message: InboxMessage) -> str:
        return log_position_text(message.partition, message.offset)

    @display(description="Outbox event")
    @once_per_row
    def outbox_event(self, message: InboxMessage) -> str:
        event_id = _as_uuid(message.event_id)
        # exists(), not first(): first() orders by the events' commit order, and PostgreSQL
        # then walks that index through every day partition looking for the id (a second on
        # a million events) instead of reading the id's BRIN index.
        if event_id is None or not OutboxEvent.objects.filter(pk=event_id).exists():
            return "not in this database's outbox"
        url = reverse("admin:outbox_outboxevent_change", args=[event_id])
        return format_html('<a href="{}">{} (timeline)</a>', url, event_id)

    @display(description="Handler attempts, oldest first")
    @once_per_row
    def attempt_history(self, message: InboxMessage) -> str:
        attempts = list(
            InboxAttempt.objects.filter(message_id=message.pk).order_by("id")[: ATTEMPTS_SHOWN + 1]
        )
        lines = [
            (
                millis(attempt.attempted_at),
                attempt.outcome,
                f"{attempt.duration_ms:.1f} ms",
                f"partition {attempt.partition}, offset {attempt.offset}",
                attempt.member,
                attempt.handler or "-",
                attempt.error_class or "-",
                preformatted(attempt.error),
            )
            for attempt in attempts[:ATTEMPTS_SHOWN]
        ]
        # The attempts before the upgrade that added attempt rows were counted on the
        # message, never written as rows (a replay sets the count back to 0: then at least).
        unlisted = message.attempts - len(attempts)
        note = (
            format_html(
                "<p>{} earlier attempt(s) of this message are counted, not listed: they ran "
                "before attempt history was kept (last error above).</p>",
                unlisted,
            )
            if unlisted > 0 and len(attempts) <= ATTEMPTS_SHOWN
            else ""
        )
        return attempts_table(
            columns=(
                "When (UTC)",
                "Outcome",
                "Duration",
                "Record",
                "Member",
                "Handler",
                "Error class",
                "Error",
            ),
            lines=lines,
            more=len(attempts) > ATTEMPTS_SHOWN,
            api_view="inbox-message-attempts",
            pk=message.pk,
            note=note,
        )

    @action(description="Retry selected messages now", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return run_selected_action(self, request, queryset, Action.INBOX_RETRY, "Retry")

    @action(description="Replay selected FAILED messages", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return run_selected_action(self, request, queryset, Action.INBOX_REPLAY, "Replay")

    @action(description="Discard selected FAILED messages (kept)", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return run_selected_action(self, request, queryset, Action.INBOX_DISCARD, "Discard")

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

    # --- held keys (order per key) ---------------------------------------------------------------

    def held_keys_view(self, request: HttpRequest) -> HttpResponse:
        """The keys held in groups with order per key: the head, its error, the rows parked
        behind it, and the actions the user may take on each."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        group = request.GET.get("consumer_group") or None
        allowed = [
            (action, Action(action).label)
            for action, (permission, _) in INBOX_KEY_ACTIONS.items()
            if request.user.has_perm(permission)
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Held keys (order per key)",
            "opts": self.model._meta,
            "held_keys": inbox_held_keys(consumer_group=group, limit=500),
            "consumer_group": group or "",
            "actions": allowed,
        }
        return TemplateResponse(request, "admin/console/inbox_held_keys.html", context)

    def held_key_action_view(self, request: HttpRequest) -> HttpResponse:
        """Confirms, then runs one action on a held key."""
        source = request.POST if request.method == "POST" else request.GET
        action_name = source.get("action", "")
        if action_name not in INBOX_KEY_ACTIONS:
            raise PermissionDenied
        if not request.user.has_perm(INBOX_KEY_ACTIONS[action_name][0]):
            raise PermissionDenied
        group, topic, key = (source.get(name, "") for name in ("consumer_group", "topic", "key"))
        held_keys_url = reverse("admin:inbox_inboxmessage_held_keys")
        if request.method == "POST":
            try:
                record, head = inbox_key_action(
                    user=request.user,
                    action=action_name,
                    consumer_group=group,
                    topic=topic,
                    key=key,
                    source="admin",
                    note=request.POST.get("note", "")[:2000],
                )
            except InvalidTransition as error:
                self.message_user(request, str(error), messages.ERROR)
            else:
                self.message_user(
                    request,
                    f"{Action(action_name).label}: key {key!r} of topic {topic!r} in group "
                    f"{group!r}, head message {head.pk} (audit #{record.pk}). The retry task "
                    "runs the parked messages.",
                    messages.SUCCESS,
                )
            return HttpResponseRedirect(held_keys_url)
        held = inbox_held_keys(consumer_group=group, topic=topic, key=key, limit=1)
        context = {
            **self.admin_site.each_context(request),
            "title": Action(action_name).label,
            "opts": self.model._meta,
            "action": action_name,
            "consumer_group": group,
            "topic": topic,
            "key": key,
            "held": held[0] if held else None,
            "cancel_url": held_keys_url,
        }
        return TemplateResponse(request, "admin/console/inbox_held_key_action.html", context)


def _as_uuid(value: str) -> str | None:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None
