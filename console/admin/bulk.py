"""Bulk operations: the list, and a progress page per operation that reloads itself while it
runs and offers its cancel. An operation is seen by those who may view the rows it acts on,
and cancelled by those who may run its action."""

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from unfold.decorators import display

from console.admin.base import EstimatedCountPaginator, ReadOnlyModelAdmin
from console.api.permissions import view_permission
from console.bulk_operations import bulk_operation_cancel
from console.models import BulkOperation
from console.operations import ACTIONS, ConsoleError

# Seconds between two reloads of a running operation's page.
PROGRESS_REFRESH_SECONDS = 2


def _viewable_models(request: HttpRequest) -> set[str]:
    return {
        spec.model._meta.label
        for spec in ACTIONS.values()
        if request.user.has_perm(view_permission(spec.model))
    }


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyModelAdmin):
    list_display = (
        "id",
        "created_at",
        "status",
        "action",
        "requested_by",
        "progress",
        "rows_changed",
        "short_reason",
    )
    list_filter = ("status",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    def get_queryset(self, request: HttpRequest) -> QuerySet[BulkOperation]:
        return (
            super()
            .get_queryset(request)
            .select_related("audit")
            .filter(audit__model__in=_viewable_models(request))
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(_viewable_models(request))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is None:
            return bool(_viewable_models(request))
        return obj.audit.model in _viewable_models(request)

    def may_cancel(self, request: HttpRequest, operation: BulkOperation) -> bool:
        return bool(request.user.has_perm(ACTIONS[operation.audit.action].permission))

    @display(description="Action")
    def action(self, operation: BulkOperation) -> str:
        return operation.audit.get_action_display()

    @display(description="Requested by")
    def requested_by(self, operation: BulkOperation) -> str:
        return operation.audit.username

    @display(description="Progress")
    def progress(self, operation: BulkOperation) -> str:
        return (
            f"{operation.chunks_done}/{operation.chunks_total} chunks, "
            f"{operation.rows_done}/{operation.audit.requested} rows"
        )

    @display(description="Reason")
    def short_reason(self, operation: BulkOperation) -> str:
        return operation.audit.reason[:80]

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:object_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name="console_bulkoperation_cancel",
            ),
            *super().get_urls(),
        ]

    def _operation(self, request: HttpRequest, object_id: Any) -> BulkOperation:
        operation = self.get_object(request, str(object_id))
        if operation is None or not self.has_view_permission(request, operation):
            raise PermissionDenied
        return operation

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        operation = self._operation(request, object_id)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Bulk operation {operation.pk}",
            "opts": self.model._meta,
            "operation": operation,
            "refresh_seconds": PROGRESS_REFRESH_SECONDS,
            "may_cancel": self.may_cancel(request, operation),
            "cancel_url": reverse("admin:console_bulkoperation_cancel", args=[operation.pk]),
            "audit_url": reverse("admin:console_operatoraction_change", args=[operation.audit_id]),
        }
        return TemplateResponse(request, "admin/console/bulk_operation.html", context)

    def cancel_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        operation = self._operation(request, object_id)
        page = reverse("admin:console_bulkoperation_change", args=[operation.pk])
        if request.method != "POST":
            return HttpResponseRedirect(page)
        try:
            operation = bulk_operation_cancel(
                user=request.user,
                operation=operation,
                source="admin",
                note=request.POST.get("note", "")[:2000],
            )
        except ConsoleError as error:
            self.message_user(request, str(error), messages.ERROR)
            return HttpResponseRedirect(page)
        self.message_user(
            request,
            f"Bulk operation {operation.pk}: "
            + (
                "cancelled."
                if operation.is_finished
                else "cancel requested; it stops before its next chunk."
            ),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(page)
