import uuid
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
from console.api.outbox.filters import OutboxEventFilter
from console.api.outbox.serializers import (
    BulkReplayInputSerializer,
    KeyReleaseInputSerializer,
    KeyReleaseResultSerializer,
    OutboxBulkInputSerializer,
    OutboxDeliverySerializer,
    OutboxEventDetailSerializer,
    OutboxEventListSerializer,
    ReplayInputSerializer,
)
from console.api.pagination import AttemptPagination, ConsoleCursorPagination
from console.api.permissions import view_permission
from console.api.serializers import (
    ActionInputSerializer,
    bulk_request_schema,
    bulk_results_schema,
)
from console.models import OperatorAction
from console.operations import outbox_event_action, outbox_key_release_action
from console.selectors import outbox_event_attempts
from outbox.models import OutboxEvent, OutboxEventPermission
from outbox.selectors import (
    outbox_event_delivered,
    outbox_events_with_delivery,
)

Action = OperatorAction.Action
VIEW = [view_permission(OutboxEvent)]
RETRY = [OutboxEventPermission.RETRY]
DISCARD = [OutboxEventPermission.DISCARD]
REPLAY = [OutboxEventPermission.REPLAY]
ACTIONS = {"retry", "discard", "replay", "bulk_retry", "bulk_discard", "bulk_replay", "release"}
BULK_RESULTS = bulk_results_schema()
BULK_REQUEST = bulk_request_schema(
    name="OutboxBulk",
    serializer_class=OutboxBulkInputSerializer,
    filterset_class=OutboxEventFilter,
)
BULK_REPLAY_REQUEST = bulk_request_schema(
    name="OutboxBulkReplay",
    serializer_class=BulkReplayInputSerializer,
    filterset_class=OutboxEventFilter,
)


class OutboxCursorPagination(ConsoleCursorPagination):
    # Newest first, by the relay's index (outbox.models.OutboxEvent.Meta); the cursor holds a
    # transaction id, and an offset among the events of one transaction.
    ordering = ("-transaction_id", "-position")


class OutboxEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Outbox events: list (cursor-paginated, filtered), detail with the consumers' timeline,
    each event's delivery attempts, and the operators' repairs, singly and in bulk. Status,
    attempts, last error, publication and discard are the event's delivery as users see it,
    read from the relay's delivery records and held set."""

    queryset = OutboxEvent.objects.all()
    filterset_class = OutboxEventFilter
    pagination_class = OutboxCursorPagination
    required_permissions = {
        "list": VIEW,
        "retrieve": VIEW,
        "attempts": VIEW,
        "retry": [*VIEW, *RETRY],
        "bulk_retry": [*VIEW, *RETRY],
        "discard": [*VIEW, *DISCARD],
        "bulk_discard": [*VIEW, *DISCARD],
        "replay": [*VIEW, *REPLAY],
        "bulk_replay": [*VIEW, *REPLAY],
        "release": [*VIEW, OutboxEventPermission.RELEASE_KEY],
    }

    def get_queryset(self) -> QuerySet[OutboxEvent]:
        events = OutboxEvent.objects.all()
        if self.action == "attempts":
            return events.only("pk", "created_at")  # whether it exists, where its records are
        if self.action == "list":
            # Payloads can be large; a list never needs them.
            events = events.defer("payload", "headers")
        return outbox_events_with_delivery(events)

    def get_serializer_class(self) -> Any:
        return OutboxEventListSerializer if self.action == "list" else OutboxEventDetailSerializer

    def get_throttles(self) -> list[BaseThrottle]:
        self.throttle_scope = "actions" if self.action in ACTIONS else ""
        return super().get_throttles()

    def get_object(self) -> OutboxEvent:
        value = self.kwargs.get("pk", "")
        try:
            uuid.UUID(str(value))
        except ValueError:
            raise ConsoleAPIError(
                "invalid_id", f"{value!r} is not an event id; event ids are UUIDs."
            ) from None
        event: OutboxEvent = super().get_object()
        return event

    def _single(self, request: Request, action_name: str, note: str) -> Response:
        event = outbox_event_action(
            user=request.user, event=self.get_object(), action=action_name, source="api", note=note
        )
        # Read again with its delivery: the repair changed the held set and the delivery
        # records, not the row, and a replay with a new event id returns a new row.
        event = outbox_event_delivered(event_id=event.pk)
        detail = OutboxEventDetailSerializer(event, context=self.get_serializer_context())
        return Response(detail.data)

    @extend_schema(responses=OutboxDeliverySerializer(many=True))
    @action(
        detail=True,
        methods=["get"],
        pagination_class=AttemptPagination,
        filter_backends=[],
    )
    def attempts(self, request: Request, pk: str | None = None) -> Response:
        """The event's delivery attempts, oldest first: each try's outcome (PUBLISHED, FAILED,
        or DISCARDED by an operator), when, how long it took, where it went, and its error and
        the error's class. Empty for an event not tried yet; the tries an earlier version made
        before migration 0012 are not listed (that migration kept their outcome and their
        number, not each try)."""
        event = self.get_object()
        records = outbox_event_attempts(event)
        page = self.paginate_queryset(records)
        return self.get_paginated_response(OutboxDeliverySerializer(page, many=True).data)

    @extend_schema(request=ActionInputSerializer, responses=OutboxEventDetailSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        """Sends a FAILED (or backing-off PENDING) event again now, with fresh attempts."""
        data = _valid(ActionInputSerializer, request)
        return self._single(request, Action.OUTBOX_RETRY, data["note"])

    @extend_schema(request=ActionInputSerializer, responses=OutboxEventDetailSerializer)
    @action(detail=True, methods=["post"])
    def discard(self, request: Request, pk: str | None = None) -> Response:
        """Gives up on a FAILED event; the row stays for audit."""
        data = _valid(ActionInputSerializer, request)
        return self._single(request, Action.OUTBOX_DISCARD, data["note"])

    @extend_schema(request=ReplayInputSerializer, responses=OutboxEventDetailSerializer)
    @action(detail=True, methods=["post"])
    def replay(self, request: Request, pk: str | None = None) -> Response:
        """Publishes a DONE or discarded event again, with the same or a new event id."""
        data = _valid(ReplayInputSerializer, request)
        name = Action.OUTBOX_REPLAY_NEW_ID if data["new_event_id"] else Action.OUTBOX_REPLAY
        return self._single(request, name, data["note"])

    def _bulk(self, request: Request, action_name: str, data: dict[str, Any]) -> Response:
        return bulk_response(
            request=request,
            action=action_name,
            data=data,
            filterset_class=OutboxEventFilter,
            queryset=outbox_events_with_delivery(OutboxEvent.objects.all()),
        )

    @extend_schema(request=BULK_REQUEST, responses=BULK_RESULTS)
    @action(detail=False, methods=["post"], url_path="bulk/retry")
    def bulk_retry(self, request: Request) -> Response:
        """Retries the events named by ids or by filter; dry_run only counts them."""
        return self._bulk(request, Action.OUTBOX_RETRY, _valid(OutboxBulkInputSerializer, request))

    @extend_schema(request=BULK_REQUEST, responses=BULK_RESULTS)
    @action(detail=False, methods=["post"], url_path="bulk/discard")
    def bulk_discard(self, request: Request) -> Response:
        """Discards the FAILED events named by ids or by filter; dry_run only counts them."""
        return self._bulk(
            request, Action.OUTBOX_DISCARD, _valid(OutboxBulkInputSerializer, request)
        )

    @extend_schema(request=BULK_REPLAY_REQUEST, responses=BULK_RESULTS)
    @action(detail=False, methods=["post"], url_path="bulk/replay")
    def bulk_replay(self, request: Request) -> Response:
        """Replays the DONE or discarded events named by ids or by filter."""
        data = _valid(BulkReplayInputSerializer, request)
        name = Action.OUTBOX_REPLAY_NEW_ID if data["new_event_id"] else Action.OUTBOX_REPLAY
        return self._bulk(request, name, data)

    @extend_schema(request=KeyReleaseInputSerializer, responses=KeyReleaseResultSerializer)
    @action(detail=False, methods=["post"], url_path="keys/release")
    def release(self, request: Request) -> Response:
        """Lets a quarantined (topic, key) flow again: discards its FAILED events."""
        data = _valid(KeyReleaseInputSerializer, request)
        record = outbox_key_release_action(
            user=request.user, topic=data["topic"], key=data["key"], source="api", note=data["note"]
        )
        return Response({"changed": record.changed, "audit_id": record.pk})


def _valid(serializer_class: type, request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
