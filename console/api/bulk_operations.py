"""Bulk operations of the API: the list, a queued bulk action's progress, and its cancel."""

from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from console.api.fields import DateTimeFilter
from console.api.pagination import ConsoleCursorPagination
from console.api.permissions import view_permission
from console.api.serializers import ActionInputSerializer, BulkOperationSerializer
from console.bulk_operations import bulk_operation_cancel
from console.models import BulkOperation, OperatorAction
from console.operations import ACTIONS

# The models bulk operations act on, by label, with the permission that reads them.
VIEW_PERMISSIONS = {
    spec.model._meta.label: view_permission(spec.model) for spec in ACTIONS.values()
}


def _models_viewable(user: Any) -> list[str]:
    """The labels of the models whose bulk operations `user` may read."""
    return [label for label, permission in VIEW_PERMISSIONS.items() if user.has_perm(permission)]


class BulkOperationFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=BulkOperation.Status.choices)
    action = django_filters.ChoiceFilter(
        field_name="audit__action",
        choices=[(name, OperatorAction.Action(name).label) for name in ACTIONS],
        help_text="The operator action it runs, e.g. outbox.retry.",
    )
    model = django_filters.ChoiceFilter(
        field_name="audit__model",
        choices=[(label, label) for label in sorted(VIEW_PERMISSIONS)],
        help_text="The model of the rows it acts on.",
    )
    created_after = DateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = DateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = BulkOperation
        fields: list[str] = []


class BulkOperationPagination(ConsoleCursorPagination):
    # Newest first, by the index on created_at.
    ordering = "-created_at"


class BulkOperationViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """A bulk action over more than one chunk runs as an operation: the list, each one's
    progress (chunks and rows done, rows changed), and its cancel, which takes effect before
    the next chunk.

    Reading one needs the view permission of the model it acts on (the list shows only
    those); cancelling it, the permission of its action (e.g. outbox.retry_outboxevent for a
    retry of events)."""

    queryset = BulkOperation.objects.select_related("audit")
    serializer_class = BulkOperationSerializer
    filterset_class = BulkOperationFilter
    pagination_class = BulkOperationPagination
    # Ids are numbers: anything else is no operation (404), never a database error.
    lookup_value_regex = "[0-9]{1,18}"
    # Any signed-in user may ask; the row says which permissions it needs (object_permissions),
    # and the list holds the rows the user may read.
    required_permissions: dict[str, list[str]] = {"list": [], "retrieve": [], "cancel": []}

    def object_permissions(self, operation: BulkOperation) -> list[str]:
        spec = ACTIONS[operation.audit.action]
        needed = [view_permission(spec.model)]
        if self.action == "cancel":
            needed.append(str(spec.permission))
        return needed

    def get_queryset(self) -> QuerySet[BulkOperation]:
        operations = BulkOperation.objects.select_related("audit")
        if self.action == "list":
            operations = operations.filter(audit__model__in=_models_viewable(self.request.user))
        return operations

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

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The bulk operations on the models the user may read, newest first
        (cursor-paginated), filtered by status, action, model and time of creation."""
        return super().list(request, *args, **kwargs)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The operation and its progress."""
        return super().retrieve(request, *args, **kwargs)
