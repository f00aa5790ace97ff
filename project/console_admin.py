"""Admin pieces the outbox and inbox consoles share: a paginator that never counts millions of
rows, exact-match text filters (served by indexes, unlike icontains), JSON display, the
confirmation of a detail-page action, and the "retry everything matching the filter"
confirmation view."""

import json
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import flatten_fieldsets
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from unfold.admin import ModelAdmin
from unfold.contrib.filters.admin import FieldTextFilter

from project.operations import BulkTooLarge, ConsoleError, bulk_action_run
from project.selectors import table_row_estimate


class ReadOnlyModelAdmin(ModelAdmin):
    """Rows the product writes (events, messages, the audit log): never added, edited or
    deleted through a form; operators change them only through audited actions."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Sequence[str]:
        # Nothing here is edited: every field the fieldsets show is read-only, computed
        # ones (JSON, badges, the timeline) included, so the list is not written twice.
        if self.fieldsets:
            return flatten_fieldsets(self.fieldsets)
        return super().get_readonly_fields(request, obj)


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to CONSOLE_COUNT_LIMIT matches; beyond, says "at least" that many.
    An unfiltered list takes PostgreSQL's estimate of the table's size: no COUNT(*) over
    millions of rows, ever."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        limit = settings.CONSOLE_COUNT_LIMIT
        if isinstance(queryset, QuerySet):
            if not queryset.query.where:
                estimate = table_row_estimate(queryset.model._meta.db_table)
                if estimate > limit:
                    return estimate
            return int(queryset.order_by()[: limit + 1].count())
        return len(queryset)


class ExactTextFilter(FieldTextFilter):
    """A text box that filters by equality, so the column's index serves it."""

    def __init__(
        self,
        field: Any,
        request: HttpRequest,
        params: dict[str, Any],
        model: Any,
        model_admin: Any,
        field_path: str,
    ) -> None:
        self.lookup_kwarg = field_path
        self.lookup_val = params.get(field_path)
        admin.FieldListFilter.__init__(self, field, request, params, model, model_admin, field_path)

    def expected_parameters(self) -> list[str | None]:
        return [self.field_path]


def pretty_json(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html(
        '<pre class="console-json" style="white-space: pre-wrap; max-height: 32rem; '
        'overflow: auto; font-family: monospace; font-size: 12px">{}</pre>',
        text,
    )


def preformatted(value: str) -> str:
    if not value:
        return "-"
    return format_html(
        '<pre style="white-space: pre-wrap; font-family: monospace; font-size: 12px">{}</pre>',
        value,
    )


STATUS_COLOURS = {"PENDING": "#b45309", "DONE": "#15803d", "FAILED": "#b91c1c"}


def status_badge(status: str, *, discarded: bool = False) -> str:
    colour = "#6b7280" if discarded else STATUS_COLOURS.get(status, "#6b7280")
    label = f"{status} (discarded)" if discarded else status
    return format_html('<span style="color: {}; font-weight: 600">{}</span>', colour, label)


def run_selected_action(
    model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, name: str, verb: str
) -> None:
    """An admin list action: runs `name` over the selected rows and tells the operator what
    changed, what was skipped, or where the large set was queued."""
    try:
        record = bulk_action_run(user=request.user, action=name, source="admin", queryset=queryset)
    except ConsoleError as error:
        model_admin.message_user(request, str(error), messages.ERROR)
        return
    if record.chunks_pending:
        model_admin.message_user(
            request,
            f"{verb}: {record.requested} selected, queued in {record.chunks_pending} chunks "
            f"(audit #{record.pk}).",
            messages.SUCCESS,
        )
        return
    skipped = record.requested - record.changed
    model_admin.message_user(
        request,
        f"{verb}: {record.changed} of {record.requested} selected"
        + (f"; {skipped} skipped (not in a state that allows it)" if skipped else "")
        + f" (audit #{record.pk}).",
        messages.SUCCESS if record.changed else messages.WARNING,
    )


def detail_action_confirmation(
    model_admin: admin.ModelAdmin, request: HttpRequest, obj: Any, *, verb: str
) -> HttpResponse | None:
    """None when the request is a POST, which may go on and change the row; otherwise the
    page that asks for that POST. Unfold renders detail actions as links, and a GET (a
    prefetching browser, a link from another site) must never retry, replay or discard."""
    if request.method == "POST":
        return None
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{verb}: {opts.verbose_name} {obj.pk}",
        "opts": opts,
        "object_pk": obj.pk,
        "object_label": str(opts.verbose_name).capitalize(),
        "status": obj.status,
        "verb": verb,
        "cancel_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]),
    }
    return TemplateResponse(request, "admin/console/detail_confirm.html", context)


def bulk_matching_view(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    *,
    action: str,
    permission_check: Any,
    verb: str,
) -> HttpResponse:
    """GET: counts the rows of the changelist's current filter and asks to confirm.
    POST: freezes their ids and runs the action (in Celery chunks when large)."""
    if not permission_check(request):
        raise PermissionDenied
    opts = model_admin.model._meta
    changelist_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    filters_query = (
        request.POST.get("_changelist_filters", "")
        if request.method == "POST"
        else request.GET.urlencode()
    )
    original_get = request.GET
    request.GET = QueryDict(filters_query)
    try:
        changelist = model_admin.get_changelist_instance(request)
        queryset = changelist.get_queryset(request)
    except IncorrectLookupParameters:
        model_admin.message_user(request, "The filter is not valid.", messages.ERROR)
        return HttpResponseRedirect(changelist_url)
    finally:
        request.GET = original_get
    back = f"{changelist_url}?{filters_query}" if filters_query else changelist_url
    filters = {key: QueryDict(filters_query).getlist(key) for key in QueryDict(filters_query)}
    if request.method == "POST":
        try:
            record = bulk_action_run(
                user=request.user,
                action=action,
                source="admin",
                queryset=queryset,
                filters=filters,
                note=request.POST.get("note", "")[:2000],
            )
        except BulkTooLarge as error:
            model_admin.message_user(request, str(error), messages.ERROR)
            return HttpResponseRedirect(back)
        except ConsoleError as error:
            model_admin.message_user(request, str(error), messages.ERROR)
            return HttpResponseRedirect(back)
        if record.chunks_pending:
            text = (
                f"{verb}: {record.requested} rows frozen and queued in {record.chunks_pending} "
                f"chunks; audit entry #{record.pk} counts the progress."
            )
        else:
            text = (
                f"{verb}: {record.changed} of {record.requested} rows changed (audit #{record.pk})."
            )
        model_admin.message_user(request, text, messages.SUCCESS)
        return HttpResponseRedirect(back)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{verb}: everything matching the filter",
        "opts": opts,
        "count": queryset.count(),
        "filters": filters,
        "filters_query": filters_query,
        "verb": verb,
        "back": back,
        "chunk_size": settings.CONSOLE_BULK_CHUNK_SIZE,
        "max_rows": settings.CONSOLE_BULK_MAX_ROWS,
    }
    return TemplateResponse(request, "admin/console/bulk_confirm.html", context)
