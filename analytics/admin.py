"""List pages of the analytics results and a button that runs the job. Charts of the results
over time belong to the console (analytics/selectors.py serves both)."""

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse
from unfold.admin import ModelAdmin
from unfold.decorators import action

from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)


class ReadOnlyAdmin(ModelAdmin):
    """Results are written by the job only."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(AnalyticsRun)
class AnalyticsRunAdmin(ReadOnlyAdmin):
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
    )
    list_filter = ("status", "trigger")
    date_hierarchy = "started_at"
    actions_list = ("run_now",)

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("analytics.add_analyticsrun")

    @action(description="Run analytics on the last closed hour", permissions=["run"])
    def run_now(self, request: HttpRequest) -> HttpResponseRedirect:
        from analytics.tasks import run_analytics

        transaction.on_commit(lambda: run_analytics.delay(trigger=AnalyticsRun.Trigger.ADMIN))
        self.message_user(
            request,
            "The analytics job was queued; its run appears here when the worker starts it.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(reverse("admin:analytics_analyticsrun_changelist"))


class RunResultAdmin(ReadOnlyAdmin):
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
