from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from console.api.bulk import bulk_response
from console.api.exceptions import ConsoleAPIError
from console.api.inbox.filters import InboxMessageFilter
from console.api.inbox.serializers import (
    HeldKeyActionInputSerializer,
    HeldKeyActionResultSerializer,
    HeldKeyQuerySerializer,
    HeldKeySerializer,
    InboxAttemptSerializer,
    InboxBulkInputSerializer,
    InboxMessageDetailSerializer,
    InboxMessageListSerializer,
)
from console.api.pagination import AttemptPagination, ConsoleCursorPagination
from console.api.permissions import view_permission
from console.api.serializers import (
    ActionInputSerializer,
    bulk_request_schema,
    bulk_results_schema,
)
from console.models import OperatorAction
from console.operations import inbox_key_action, inbox_message_action
from inbox.models import InboxAttempt, InboxMessage, InboxMessagePermission
from inbox.selectors import inbox_held_keys

Action = OperatorAction.Action
VIEW = [view_permission(InboxMessage)]
RETRY = [InboxMessagePermission.RETRY]
REPLAY = [InboxMessagePermission.REPLAY]
DISCARD = [InboxMessagePermission.DISCARD]
ACTIONS = {"retry", "replay", "discard", "bulk_retry", "bulk_replay", "bulk_discard"}
BULK_RESULTS = bulk_results_schema()
BULK_REQUEST = bulk_request_schema(
    name="InboxBulk", serializer_class=InboxBulkInputSerializer, filterset_class=InboxMessageFilter
)


class InboxCursorPagination(ConsoleCursorPagination):
    ordering = "-received_at"


class InboxMessageViewSet(viewsets.ReadOnlyModelViewSet):
    """Inbox messages of every consumer group: list, detail, retry, replay and discard."""

    queryset = InboxMessage.objects.all()
    filterset_class = InboxMessageFilter
    pagination_class = InboxCursorPagination
    required_permissions = {
        "list": VIEW,
        "retrieve": VIEW,
        "attempts": VIEW,
        "retry": [*VIEW, *RETRY],
        "bulk_retry": [*VIEW, *RETRY],
        "replay": [*VIEW, *REPLAY],
        "bulk_replay": [*VIEW, *REPLAY],
        "discard": [*VIEW, *DISCARD],
        "bulk_discard": [*VIEW, *DISCARD],
    }

    def get_queryset(self) -> QuerySet[InboxMessage]:
        messages = InboxMessage.objects.all()
        if self.action == "attempts":
            return messages.only("pk")  # only whether the message exists
        if self.action == "list":
            messages = messages.defer("payload", "headers", "raw_value")
        return messages

    def get_serializer_class(self) -> Any:
        return InboxMessageListSerializer if self.action == "list" else InboxMessageDetailSerializer

    def get_throttles(self) -> list[BaseThrottle]:
        self.throttle_scope = "actions" if self.action in ACTIONS else ""
        return super().get_throttles()

    def get_object(self) -> InboxMessage:
        value = str(self.kwargs.get("pk", ""))
        if not value.isdigit():
            raise ConsoleAPIError(
                "invalid_id", f"{value!r} is not a message id; message ids are integers."
            )
        message: InboxMessage = super().get_object()
        return message

    def _single(self, request: Request, action_name: str) -> Response:
        serializer = ActionInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        message = inbox_message_action(
            user=request.user,
            message=self.get_object(),
            action=action_name,
            source="api",
            note=serializer.validated_data["note"],
        )
        detail = InboxMessageDetailSerializer(message, context=self.get_serializer_context())
        return Response(detail.data)

    @extend_schema(responses=InboxAttemptSerializer(many=True))
    @action(
        detail=True,
        methods=["get"],
        pagination_class=AttemptPagination,
        filter_backends=[],
    )
    def attempts(self, request: Request, pk: str | None = None) -> Response:
        """The message's handler attempts, oldest first: each run's outcome (DONE or FAILED),
        when, how long, who ran it (consumer member or retry task), the record it ran and its
        error. Empty for a message no handler ran (a duplicate is counted on the message, a
        poison record or a parked one never ran); the attempts made before attempt history
        was kept are counted in the message's `attempts`, not listed."""
        message = self.get_object()
        attempts = InboxAttempt.objects.filter(message_id=message.pk)
        page = self.paginate_queryset(attempts)
        return self.get_paginated_response(InboxAttemptSerializer(page, many=True).data)

    @extend_schema(request=ActionInputSerializer, responses=InboxMessageDetailSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        """Runs a FAILED or backing-off PENDING message again now (by the retry task)."""
        return self._single(request, Action.INBOX_RETRY)

    @extend_schema(request=ActionInputSerializer, responses=InboxMessageDetailSerializer)
    @action(detail=True, methods=["post"])
    def replay(self, request: Request, pk: str | None = None) -> Response:
        """Gives a FAILED message a fresh retry budget, due now."""
        return self._single(request, Action.INBOX_REPLAY)

    @extend_schema(request=ActionInputSerializer, responses=InboxMessageDetailSerializer)
    @action(detail=True, methods=["post"])
    def discard(self, request: Request, pk: str | None = None) -> Response:
        """Marks a FAILED message as discarded: kept for audit, no longer run or alerted on."""
        return self._single(request, Action.INBOX_DISCARD)

    def _bulk(self, request: Request, action_name: str) -> Response:
        serializer = InboxBulkInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return bulk_response(
            request=request,
            action=action_name,
            data=dict(serializer.validated_data),
            filterset_class=InboxMessageFilter,
            queryset=InboxMessage.objects.all(),
        )

    @extend_schema(request=BULK_REQUEST, responses=BULK_RESULTS)
    @action(detail=False, methods=["post"], url_path="bulk/retry")
    def bulk_retry(self, request: Request) -> Response:
        """Retries the messages named by ids or by filter; dry_run only counts them."""
        return self._bulk(request, Action.INBOX_RETRY)

    @extend_schema(request=BULK_REQUEST, responses=BULK_RESULTS)
    @action(detail=False, methods=["post"], url_path="bulk/replay")
    def bulk_replay(self, request: Request) -> Response:
        """Replays the FAILED messages named by ids or by filter; dry_run only counts them."""
        return self._bulk(request, Action.INBOX_REPLAY)

    @extend_schema(request=BULK_REQUEST, responses=BULK_RESULTS)
    @action(detail=False, methods=["post"], url_path="bulk/discard")
    def bulk_discard(self, request: Request) -> Response:
        """Discards the FAILED messages named by ids or by filter; dry_run only counts them."""
        return self._bulk(request, Action.INBOX_DISCARD)


class HeldKeyViewSet(viewsets.ViewSet):
    """Keys held in groups with ordering "key" (a failed head, the rows parked behind it),
    and the operators' actions on one: retry its sequence, skip its head, release it."""

    required_permissions = {
        "list": VIEW,
        "retry": [*VIEW, InboxMessagePermission.RETRY_SEQUENCE],
        "skip_head": [*VIEW, InboxMessagePermission.SKIP_HEAD],
        "release": [*VIEW, InboxMessagePermission.RELEASE_KEY],
    }

    def get_throttles(self) -> list[BaseThrottle]:
        self.throttle_scope = "" if self.action == "list" else "actions"
        return super().get_throttles()

    @extend_schema(parameters=[HeldKeyQuerySerializer], responses=HeldKeySerializer(many=True))
    def list(self, request: Request) -> Response:
        """The held keys, the longest held first."""
        query = HeldKeyQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        held = inbox_held_keys(
            consumer_group=query.validated_data.get("consumer_group"),
            limit=query.validated_data["limit"],
        )
        return Response(HeldKeySerializer(held, many=True).data)

    def _act(self, request: Request, action_name: str) -> Response:
        data = HeldKeyActionInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        record, head = inbox_key_action(
            user=request.user,
            action=action_name,
            consumer_group=data.validated_data["consumer_group"],
            topic=data.validated_data["topic"],
            key=data.validated_data["key"],
            source="api",
            note=data.validated_data["note"],
        )
        return Response(HeldKeyActionResultSerializer({"head": head, "audit_id": record.pk}).data)

    @extend_schema(request=HeldKeyActionInputSerializer, responses=HeldKeyActionResultSerializer)
    @action(detail=False, methods=["post"])
    def retry(self, request: Request) -> Response:
        """Makes the head due now (a FAILED one with a fresh retry budget); the retry task
        runs it and then the parked rows, in order, until one fails."""
        return self._act(request, Action.INBOX_SEQUENCE_RETRY)

    @extend_schema(request=HeldKeyActionInputSerializer, responses=HeldKeyActionResultSerializer)
    @action(detail=False, methods=["post"], url_path="skip-head")
    def skip_head(self, request: Request) -> Response:
        """Discards the head (it never runs); the retry task runs the parked rows."""
        return self._act(request, Action.INBOX_SKIP_HEAD)

    @extend_schema(request=HeldKeyActionInputSerializer, responses=HeldKeyActionResultSerializer)
    @action(detail=False, methods=["post"])
    def release(self, request: Request) -> Response:
        """The head keeps its state and no longer holds the key; the retry task runs the
        parked rows."""
        return self._act(request, Action.INBOX_KEY_RELEASE)
