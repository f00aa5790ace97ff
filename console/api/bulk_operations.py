"""Bulk operations of the API: a queued bulk action's progress, and its cancel."""

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from console.api.permissions import view_permission
from console.api.serializers import ActionInputSerializer, BulkOperationSerializer
from console.bulk_operations import bulk_operation_cancel
from console.models import BulkOperation
from console.operations import ACTIONS


class BulkOperationViewSet(mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A bulk action over more than one chunk runs as an operation: its progress (chunks and
    rows done, rows changed), and its cancel, which takes effect before the next chunk.

    Reading one needs the view permission of the model it acts on; cancelling it, the
    permission of its action (e.g. outbox.retry_outboxevent for a retry of events)."""

    queryset = BulkOperation.objects.select_related("audit")
    serializer_class = BulkOperationSerializer
    # Ids are numbers: anything else is no operation (404), never a database error.
    lookup_value_regex = "[0-9]{1,18}"
    # Any signed-in user may ask; the row says which permissions it needs (object_permissions).
    required_permissions: dict[str, list[str]] = {"retrieve": [], "cancel": []}

    def object_permissions(self, operation: BulkOperation) -> list[str]:
        spec = ACTIONS[operation.audit.action]
        needed = [view_permission(spec.model)]
        if self.action == "cancel":
            needed.append(str(spec.permission))
        return needed

    def get_queryset(self) -> QuerySet[BulkOperation]:
        return BulkOperation.objects.select_related("audit")

    def get_throttles(self) -> list[BaseThrottle]:
        self.throttle_scope = "actions" if self.action == "cancel" else ""
        return super().get_throttles()

    @extend_schema(request=ActionInputSerializer, responses=BulkOperationSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancels the operation: a queued one at once, a running one before its next chunk
        (the chunks already applied stay applied). 409 once it has finished."""
        operation = self.get_object()
        data = ActionInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        operation = bulk_operation_cancel(
            user=request.user, operation=operation, source="api", note=data.validated_data["note"]
        )
        return Response(BulkOperationSerializer(operation).data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The operation and its progress."""
        return super().retrieve(request, *args, **kwargs)
