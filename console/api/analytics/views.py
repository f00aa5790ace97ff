from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from analytics import selectors
from analytics.errors import AnalyticsError
from analytics.models import (
    AnalyticsRun,
    AnalyticsRunPermission,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from console.api.analytics.filters import (
    AnalyticsRunFilter,
    DeliveryLagStatFilter,
    DuplicateStatFilter,
    ReconciliationFindingFilter,
    RelayStatFilter,
)
from console.api.analytics.serializers import (
    AnalyticsRunSerializer,
    DeliveryLagStatSerializer,
    DuplicateStatSerializer,
    ReconciliationFindingSerializer,
    RelayStatSerializer,
    RunStartInputSerializer,
    RunStartResultSerializer,
)
from console.api.exceptions import ConsoleAPIError
from console.api.pagination import ConsoleCursorPagination
from console.api.permissions import view_permission
from console.operations import analytics_run_action

VIEW_RUNS = [view_permission(AnalyticsRun)]


def _pagination(*fields: str) -> type[ConsoleCursorPagination]:
    return type("Pagination", (ConsoleCursorPagination,), {"ordering": fields})


class AnalyticsRunViewSet(viewsets.ReadOnlyModelViewSet):
    """Runs of the analytics job, newest first, and the operators' request for a new one."""

    queryset = AnalyticsRun.objects.all()
    serializer_class = AnalyticsRunSerializer
    filterset_class = AnalyticsRunFilter
    pagination_class = _pagination("-started_at", "-id")
    # Starting a run refuses a bad window (400), never a row for its state.
    state_conflicts = False
    required_permissions = {
        "list": VIEW_RUNS,
        "retrieve": VIEW_RUNS,
        "start": [*VIEW_RUNS, AnalyticsRunPermission.RUN],
    }

    def get_throttles(self) -> list[BaseThrottle]:
        self.throttle_scope = "actions" if self.action == "start" else ""
        return super().get_throttles()

    def get_object(self) -> AnalyticsRun:
        value = str(self.kwargs.get("pk", ""))
        if not value.isdigit():
            raise ConsoleAPIError("invalid_id", f"{value!r} is not a run id; run ids are integers.")
        run: AnalyticsRun = super().get_object()
        return run

    @extend_schema(request=RunStartInputSerializer, responses={202: RunStartResultSerializer})
    @action(detail=False, methods=["post"])
    def start(self, request: Request) -> Response:
        """Queues the job (Celery `analytics.tasks.run_analytics`) on [since, until), by
        default on the last window the consume SLA has closed; audited. The run appears in
        the list when a worker starts it; its results replace those of the window's earlier
        runs."""
        serializer = RunStartInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            queued = analytics_run_action(
                user=request.user,
                source="api",
                since=data.get("since"),
                until=data.get("until"),
                note=data["note"],
            )
        except AnalyticsError as error:
            raise ConsoleAPIError(error.code, str(error)) from error
        body = {
            "queued": True,
            "window_start": queued.since,
            "window_end": queued.until,
            "audit_id": queued.audit_id,
        }
        return Response(RunStartResultSerializer(body).data, status=status.HTTP_202_ACCEPTED)


class _ResultViewSet(viewsets.ReadOnlyModelViewSet):
    """Results of succeeded runs. Without `run`, for each hour and key the row of the latest
    run covering it (overlapping windows may both hold it); with `run`, that run's rows."""

    def latest(self) -> QuerySet[Any]:
        raise NotImplementedError

    def get_queryset(self) -> QuerySet[Any]:
        model = self.serializer_class.Meta.model  # type: ignore[union-attr]
        if self.action != "list" or "run" in self.request.query_params:
            return model.objects.filter(run__status=AnalyticsRun.Status.SUCCEEDED)
        return model.objects.filter(pk__in=self.latest().values("pk"))


class DeliveryLagStatViewSet(_ResultViewSet):
    """Lag percentiles (seconds) per hour, topic, event type, consumer group and stage."""

    serializer_class = DeliveryLagStatSerializer
    filterset_class = DeliveryLagStatFilter
    pagination_class = _pagination("-hour", "-id")
    required_permissions = {"*": [view_permission(DeliveryLagStat)]}

    def latest(self) -> QuerySet[Any]:
        return selectors.delivery_lag_series(stage=None)


class DuplicateStatViewSet(_ResultViewSet):
    """Deliveries, unique events, duplicates and duplicate rate per hour, topic and group."""

    serializer_class = DuplicateStatSerializer
    filterset_class = DuplicateStatFilter
    pagination_class = _pagination("-hour", "-id")
    required_permissions = {"*": [view_permission(DuplicateStat)]}

    def latest(self) -> QuerySet[Any]:
        return selectors.duplicate_rate_series()


class RelayStatViewSet(_ResultViewSet):
    """The relay's retries and failures per hour and topic."""

    serializer_class = RelayStatSerializer
    filterset_class = RelayStatFilter
    pagination_class = _pagination("-hour", "-id")
    required_permissions = {"*": [view_permission(RelayStat)]}

    def latest(self) -> QuerySet[Any]:
        return selectors.relay_stat_series()


class ReconciliationFindingViewSet(viewsets.ReadOnlyModelViewSet):
    """Findings of the succeeded runs, newest first; `run` narrows to one run, `event_id`
    to one event's findings over every run."""

    serializer_class = ReconciliationFindingSerializer
    filterset_class = ReconciliationFindingFilter
    pagination_class = _pagination("-id")
    required_permissions = {"*": [view_permission(ReconciliationFinding)]}

    def get_queryset(self) -> QuerySet[Any]:
        return selectors.reconciliation_finding_all()
