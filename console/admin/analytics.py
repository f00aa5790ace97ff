"""List pages of the analytics results and a button that runs the job. Charts of the results
over time are on the dashboard (analytics/selectors.py serves both)."""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import Truncator
from unfold.decorators import action, display

from analytics.models import (
    AnalyticsRun,
    AnalyticsRunPermission,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from analytics.services import analytics_window_default
from console.admin.base import ReadOnlyModelAdmin
from console.operations import analytics_run_action

# Characters of a run's error its list row shows.
ERROR_LINE_CHARS = 120


@admin.register(AnalyticsRun)
class AnalyticsRunAdmin(ReadOnlyModelAdmin):
    list_display = (
        "id",
        "status",
        "trigger",
        "window_start",
        "window_end",
        "started_at",
        "duration_seconds",
        "rows_read",
        "findings",
        "spark_master",
        "error_line",
    )
    list_filter = ("status", "trigger")
    date_hierarchy = "started_at"
    actions_list = ("run_now",)

    @display(description="error")
    def error_line(self, run: AnalyticsRun) -> str:
        """Why a run FAILED (the job's error, or the reaper's: its worker stopped), cut to a
        line; the run's page shows it whole."""
        return Truncator(run.error.partition("\n")[0]).chars(ERROR_LINE_CHARS)

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(AnalyticsRunPermission.RUN)

    @action(description="Run analytics on the last closed hour", permissions=["run"])
    def run_now(self, request: HttpRequest) -> HttpResponse:
        """Confirms, then queues the job on the last closed window (audited)."""
        if not self.has_run_permission(request):
            raise PermissionDenied
        since, until = analytics_window_default()
        if request.method == "POST":
            queued = analytics_run_action(
                user=request.user, source="admin", note=request.POST.get("note", "")[:2000]
            )
            self.message_user(
                request,
                f"The analytics job on {queued.since:%Y-%m-%d %H:%M} - {queued.until:%H:%M} UTC "
                f"was queued (audit #{queued.audit_id}); its run appears here when the worker "
                "starts it.",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(reverse("admin:analytics_analyticsrun_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Run analytics",
            "opts": self.model._meta,
            "since": since,
            "until": until,
        }
        return TemplateResponse(request, "admin/analytics/run_confirm.html", context)


class RunResultAdmin(ReadOnlyModelAdmin):
    """Results are written by the job only."""

    list_select_related = ("run",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).filter(run__status=AnalyticsRun.Status.SUCCEEDED)


@admin.register(DeliveryLagStat)
class DeliveryLagStatAdmin(RunResultAdmin):
    list_display = (
        "hour",
        "topic",
        "event_type",
        "consumer_group",
        "stage",
        "count",
        "p50",
        "p95",
        "p99",
        "max",
    )
    list_filter = ("stage", "topic", "consumer_group")
    search_fields = ("topic", "event_type", "consumer_group")
    date_hierarchy = "hour"


@admin.register(DuplicateStat)
class DuplicateStatAdmin(RunResultAdmin):
    list_display = (
        "hour",
        "topic",
        "consumer_group",
        "deliveries",
        "unique_events",
        "duplicate_deliveries",
        "duplicate_rate",
        "max_copies",
    )
    list_filter = ("topic", "consumer_group")
    search_fields = ("topic", "consumer_group")
    date_hierarchy = "hour"


@admin.register(RelayStat)
class RelayStatAdmin(RunResultAdmin):
    list_display = (
        "hour",
        "topic",
        "events",
        "published",
        "pending",
        "failed",
        "retried",
        "retry_rate",
        "failure_rate",
        "max_attempts",
    )
    list_filter = ("topic",)
    search_fields = ("topic",)
    date_hierarchy = "hour"


@admin.register(ReconciliationFinding)
class ReconciliationFindingAdmin(RunResultAdmin):
    list_display = (
        "kind",
        "event_id",
        "topic",
        "event_type",
        "consumer_group",
        "created_at",
        "kafka_partition",
        "kafka_offsets",
        "detail",
        "run",
    )
    list_filter = ("kind", "topic", "consumer_group")
    search_fields = ("event_id", "topic", "event_type", "consumer_group")
