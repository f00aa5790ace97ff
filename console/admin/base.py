"""Admin pieces the console's pages share: read-only admins, a paginator that never counts
millions of rows, exact-match text filters (served by indexes, unlike icontains), JSON display,
the confirmation of a detail-page action, the "retry everything matching the filter"
confirmation view, and DeliveryAdmin, the base of the outbox events' and inbox messages'
admins."""

import functools
import json
import operator
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import flatten_fieldsets
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet
from django.db.models.sql.where import WhereNode
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from unfold.admin import ModelAdmin
from unfold.contrib.filters.admin import FieldTextFilter, TextFilter
from unfold.decorators import display
from unfold.views import ChangeList

from console.bulk_operations import bulk_action_run
from console.models import OperatorAction
from console.operations import ConsoleError, ReasonRequired
from console.privacy import masked, may_view_payload
from console.selectors import (
    failure_group_count,
    failure_groups,
    rows_counted_up_to,
    rows_of_error_class,
    table_row_estimate,
)
from inbox.errors import InboxError
from kafka_events.tracing import trace_id_from_headers
from outbox.errors import OutboxError


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
    millions of rows, ever.

    Lists of rows with computed columns (an outbox event's delivery, read from its records)
    are counted and paged by key first (the id, and the row_place): PostgreSQL computes a
    row's columns before OFFSET skips it, so page 200 would compute them for 5,000 rows to
    show 25.

    A filtered list reads its first page's keys before counting: a filter that matches no more
    than a page (a rare value no index serves, whose every read walks the table) is counted
    by that read alone."""

    # Unfold's pagination with the count worded by count_text.
    template_name = "admin/console/pagination.html"
    # Fields that find a row by a B-tree index when its id has none (an outbox event's day
    # partition and commit order: its id has a BRIN index only, which reads thousands of rows
    # of each partition to find 25): a page's rows are read by these with their ids.
    row_place: tuple[str, ...] = ()

    @cached_property
    def count(self) -> int:
        return self._count_and_text[0]

    @property
    def count_text(self) -> str:
        """The count as the page must say it when it is not exact: "about N" (PostgreSQL's
        estimate of the table), "more than N" (counting stopped at CONSOLE_COUNT_LIMIT); empty
        when the count is exact."""
        return self._count_and_text[1]

    @cached_property
    def _count_and_text(self) -> tuple[int, str]:
        queryset = self.object_list
        limit = settings.CONSOLE_COUNT_LIMIT
        if isinstance(queryset, QuerySet):
            if not queryset.query.where:
                estimate = table_row_estimate(queryset.model._meta.db_table)
                if estimate > limit:
                    return estimate, f"about {estimate}"
            elif len(self._first_keys) <= self.per_page:
                return len(self._first_keys), ""
            counted = rows_counted_up_to(queryset, limit=limit)
            return counted, f"more than {limit}" if counted > limit else ""
        return len(queryset), ""

    @cached_property
    def _first_keys(self) -> list[tuple[Any, ...]]:
        """The keys of the first page's rows, and of the one after them if there is one."""
        return list(self._row_keys(self.object_list)[: self.per_page + 1])  # type: ignore[arg-type]

    def _row_keys(self, queryset: QuerySet) -> QuerySet:
        return queryset.values_list("pk", *self.row_place)

    @property
    def pages_by_id(self) -> bool:
        """Whether the rows have computed columns, and a page is read by key (see above)."""
        return isinstance(self.object_list, QuerySet) and bool(self.object_list.query.annotations)

    def rows_by_key(self, keys: list[tuple[Any, ...]]) -> QuerySet:
        """The rows of `keys` (each an id, then its row_place) in the list's order, read
        lazily. The filters chose the rows; they are read by their keys alone: with the
        filters, PostgreSQL would apply them again (a status filter's hashed subquery of every
        held event, say) to compute 25 rows."""
        queryset: QuerySet = self.object_list.all()  # type: ignore[attr-defined]
        queryset.query.where = WhereNode()
        if not keys:
            return queryset.none()
        fields = ("pk", *self.row_place)
        return queryset.filter(
            functools.reduce(
                operator.or_, (Q(**dict(zip(fields, key, strict=True))) for key in keys)
            )
        )

    def first_page_rows(self) -> QuerySet:
        """The rows of a list that fits on one page, by the keys the count read."""
        return self.rows_by_key(self._first_keys[: self.per_page])

    def page(self, number: Any) -> Page:
        if not self.pages_by_id:
            return super().page(number)
        queryset: QuerySet = self.object_list  # type: ignore[assignment]
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        if bottom == 0 and "_first_keys" in self.__dict__:
            keys = self._first_keys[:top]
        else:
            keys = list(self._row_keys(queryset)[bottom:top])
        rows = {row.pk: row for row in self.rows_by_key(keys)}
        return Page([rows[key[0]] for key in keys if key[0] in rows], number, self)


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


class ErrorClassFilter(TextFilter):
    """Rows whose last error is of the class typed: the text before ':' on its first line,
    as the dashboard and the failure groups name it."""

    title = "error class"
    parameter_name = "error_class"

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = (self.value() or "").strip()
        if not value:
            return queryset
        field = getattr(self, "error_field", "last_error")
        return rows_of_error_class(queryset, value, field=field)


def error_class_filter(field: str) -> type[ErrorClassFilter]:
    """The filter on the error text in `field` (a column, or an annotation of the list)."""
    return type("ErrorClassFilter", (ErrorClassFilter,), {"error_field": field})


def once_per_row(method: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A detail page's computed field, computed once per row: Unfold's read-only field asks
    for a field's contents up to five times a render (in its constructor and its template), and
    fields such as an attempt history or a timeline run queries each time."""
    attribute = f"_once_{method.__name__}"

    @functools.wraps(method)
    def computed_once(model_admin: Any, row: Any) -> Any:
        if attribute not in row.__dict__:
            row.__dict__[attribute] = method(model_admin, row)
        return row.__dict__[attribute]

    return computed_once


def pretty_json(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html(
        '<pre class="console-json" style="white-space: pre-wrap; max-height: 32rem; '
        'overflow: auto; font-family: monospace; font-size: 12px">{}</pre>',
        text,
    )


def lag_text(started: datetime | None, ended: datetime | None) -> str:
    """The time from `started` to `ended` as an operator reads a lag: milliseconds under a
    second, seconds to the hundredth under a minute, then minutes and seconds; "-" while
    either is unknown."""
    if started is None or ended is None:
        return "-"
    seconds = (ended - started).total_seconds()
    # Clocks of two hosts (a publisher's, a consumer's) can make a lag a little negative.
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    # Each unit is chosen by the value as it will be printed (0.99996 s is "1.00 s").
    if round(seconds * 1000, 1) < 1000:
        return f"{sign}{seconds * 1000:.1f} ms"
    if round(seconds, 2) < 60:
        return f"{sign}{seconds:.2f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{sign}{minutes} min {rest} s"


def log_position_text(partition: int | None, offset: int | None) -> str:
    """Where a record sits in its topic: partition/offset."""
    return "-" if partition is None or offset is None else f"{partition}/{offset}"


def preformatted(value: str) -> str:
    if not value:
        return "-"
    return format_html(
        '<pre style="white-space: pre-wrap; font-family: monospace; font-size: 12px">{}</pre>',
        value,
    )


STATUS_COLOURS = {"PENDING": "#b45309", "DONE": "#15803d", "FAILED": "#b91c1c"}


def trace_link(headers: dict[str, str] | None) -> str | None:
    """The trace id of the context the headers carry (the event's creation context), linked
    to the tracing backend by CONSOLE_TRACE_URL_TEMPLATE when it is set; None without one."""
    trace_id = trace_id_from_headers(headers)
    if trace_id is None:
        return None
    template = settings.CONSOLE_TRACE_URL_TEMPLATE
    if not template:
        return trace_id
    return format_html(
        '<a href="{}" target="_blank" rel="noopener noreferrer">{}</a>',
        template.format(trace_id=trace_id),
        trace_id,
    )


def status_badge(status: str, *, discarded: bool = False) -> str:
    colour = "#6b7280" if discarded else STATUS_COLOURS.get(status, "#6b7280")
    label = f"{status} (discarded)" if discarded else status
    return format_html('<span style="color: {}; font-weight: 600">{}</span>', colour, label)


def bulk_progress_url(record: OperatorAction) -> str:
    return reverse("admin:console_bulkoperation_change", args=[record.bulk_operation.pk])


def run_selected_action(
    model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, name: str, verb: str
) -> HttpResponse | None:
    """An admin list action: first a page that asks for the reason (a bulk action needs one),
    then runs `name` over the selected rows and tells the operator what changed, what was
    skipped, or where the progress of a large set is shown."""
    reason = request.POST.get("reason")
    reason_error = ""
    if reason is not None:
        try:
            record = bulk_action_run(
                user=request.user, action=name, source="admin", queryset=queryset, reason=reason
            )
        except ReasonRequired as error:
            reason_error = str(error)
        except ConsoleError as error:
            model_admin.message_user(request, str(error), messages.ERROR)
            return None
        else:
            return _report_selected(model_admin, request, record, verb)
    opts = model_admin.model._meta
    changelist_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{verb}: the selected {opts.verbose_name_plural}",
        "opts": opts,
        "action": request.POST.get("action", ""),
        "select_across": request.POST.get("select_across") == "1",
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        # "Select all" may name millions of rows: counted no further than an action may go.
        "count": rows_counted_up_to(queryset, limit=settings.CONSOLE_BULK_MAX_ROWS),
        "count_limit": settings.CONSOLE_BULK_MAX_ROWS,
        "verb": verb,
        "reason": reason or "",
        "reason_error": reason_error,
        "back": f"{changelist_url}?{request.GET.urlencode()}" if request.GET else changelist_url,
    }
    return TemplateResponse(request, "admin/console/selected_confirm.html", context)


def _report_selected(
    model_admin: admin.ModelAdmin, request: HttpRequest, record: OperatorAction, verb: str
) -> HttpResponse | None:
    if record.chunks_pending:
        model_admin.message_user(
            request,
            f"{verb}: {record.requested} selected, queued in {record.chunks_pending} chunks "
            f"(audit #{record.pk}).",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(bulk_progress_url(record))
    skipped = record.requested - record.changed
    model_admin.message_user(
        request,
        f"{verb}: {record.changed} of {record.requested} selected"
        + (f"; {skipped} skipped (not in a state that allows it)" if skipped else "")
        + f" (audit #{record.pk}).",
        messages.SUCCESS if record.changed else messages.WARNING,
    )
    return None


def detail_action_confirmation(
    model_admin: admin.ModelAdmin, request: HttpRequest, obj: Any, *, verb: str, status: str
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
        "status": status,
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
    known_count: Callable[[dict[str, list[str]]], int | None] = lambda filters: None,
) -> HttpResponse:
    """GET: counts the rows of the changelist's current filter and asks to confirm.
    POST: freezes their ids and runs the action (in Celery chunks when large).
    `known_count(filters)` gives the exact count of a filter that has one at hand (a failure
    group's), None for one to count up to CONSOLE_COUNT_LIMIT."""
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
    reason = request.POST.get("reason", "") if request.method == "POST" else ""
    reason_error = ""
    if request.method == "POST":
        try:
            record = bulk_action_run(
                user=request.user,
                action=action,
                source="admin",
                queryset=queryset,
                filters=filters,
                reason=reason,
            )
        except ReasonRequired as error:
            # A form error: the confirmation again, with what the operator typed.
            reason_error = str(error)
        except ConsoleError as error:  # BulkTooLarge among them
            model_admin.message_user(request, str(error), messages.ERROR)
            return HttpResponseRedirect(back)
        else:
            if record.chunks_pending:
                model_admin.message_user(
                    request,
                    f"{verb}: {record.requested} rows frozen and queued in "
                    f"{record.chunks_pending} chunks (audit #{record.pk}).",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(bulk_progress_url(record))
            model_admin.message_user(
                request,
                f"{verb}: {record.changed} of {record.requested} rows changed "
                f"(audit #{record.pk}).",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(back)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{verb}: everything matching the filter",
        "opts": opts,
        **_confirmed_count(queryset, known_count(filters)),
        "filters": filters,
        "filters_query": filters_query,
        "verb": verb,
        "back": back,
        "chunk_size": settings.CONSOLE_BULK_CHUNK_SIZE,
        "max_rows": settings.CONSOLE_BULK_MAX_ROWS,
        "rows_per_second": settings.CONSOLE_BULK_MAX_ROWS_PER_SECOND,
        "reason": reason,
        "reason_error": reason_error,
    }
    return TemplateResponse(request, "admin/console/bulk_confirm.html", context)


def _confirmed_count(queryset: QuerySet, known: int | None) -> dict[str, Any]:
    """The rows `queryset` matches: `known` when it is not None, else counted exactly up to
    CONSOLE_COUNT_LIMIT: a filter that matches millions never costs a full COUNT(*) just to
    show a confirmation page."""
    if known is not None:
        return {"count": known, "count_is_exact": True}
    limit = settings.CONSOLE_COUNT_LIMIT
    count = rows_counted_up_to(queryset, limit=limit)
    return {"count": min(count, limit), "count_is_exact": count <= limit}


# What a detail page shows of an event's or a message's content (console/privacy.py).
PAYLOAD_FIELDS = frozenset({"payload_json", "headers_json", "raw_value", "raw_value_encoding"})


class PagedChangeList(ChangeList):
    """A list of rows with computed columns that fits on one page is read by the keys its
    count read (EstimatedCountPaginator): Django would read it through the whole filtered
    queryset again, which for the outbox walks the table once more for a rare value."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        paginator = self.paginator
        if (
            not self.multi_page
            and not self.show_all
            and isinstance(paginator, EstimatedCountPaginator)
            and paginator.pages_by_id
        ):
            self.result_list = paginator.first_page_rows()


class DeliveryAdmin(ReadOnlyModelAdmin):
    """What the admins of outbox events and inbox messages share: a list that never counts the
    whole table nor loads payloads, status badges and JSON fields, and the retry, discard and
    replay actions, each with its own permission, on the list, on the detail page and over
    everything a filter matches, all through console.operations and audited."""

    # The model's permissions (OutboxEventPermission, InboxMessagePermission).
    permissions: Any
    # The operator actions that "Retry all matching the filter" and "Discard all matching"
    # run, and the side its failure groups are read from (console.selectors.failure_groups).
    retry_action: str
    discard_action: str
    failure_side: str
    # The status filter's value for the rows of a failure group.
    failure_group_status = "FAILED"
    # Heavy columns a list page never shows.
    deferred_on_list: tuple[str, ...] = ("payload", "headers")
    # How messages name a row: "event", "message".
    row_noun: str

    list_filter_submit = True
    search_help_text = "An event id, an aggregate id or a key (exact)."
    # Never COUNT(*) the whole table; see EstimatedCountPaginator.
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    # Unfold renders a row in a few milliseconds: 25 rows keep a page well under 300 ms.
    list_per_page = 25
    # No expandable row sections. Unfold's list template asks for them twice a row, and an
    # attribute a ModelAdmin lacks costs the template engine a dir() of the admin each time.
    list_sections: tuple[str, ...] = ()

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return PagedChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The row, read once per page: the detail page asks for it again to offer the actions
        its state allows (get_actions_detail). A request that changes rows reads it afresh."""
        if request.method not in ("GET", "HEAD"):
            return super().get_object(request, object_id, from_field)
        read: dict[tuple[Any, ...], Any] = request.__dict__.setdefault("_console_rows", {})
        key = (self.model, object_id, from_field)
        if key not in read:
            read[key] = super().get_object(request, object_id, from_field)
        return read[key]

    def has_retry_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm(self.permissions.RETRY))

    def has_discard_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm(self.permissions.DISCARD))

    def has_replay_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm(self.permissions.REPLAY))

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        rows = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            rows = rows.defer(*self.deferred_on_list)
        return rows

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        opts = self.model._meta
        retry_matching_url = (
            reverse(f"admin:{opts.app_label}_{opts.model_name}_retry_matching")
            if self.has_retry_permission(request)
            else ""
        )
        extra_context = {**(extra_context or {}), "retry_matching_url": retry_matching_url}
        return super().changelist_view(request, extra_context)

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        prefix = f"{opts.app_label}_{opts.model_name}"
        return [
            path(
                "retry-matching/",
                self.admin_site.admin_view(self.retry_matching_view),
                name=f"{prefix}_retry_matching",
            ),
            path(
                "discard-matching/",
                self.admin_site.admin_view(self.discard_matching_view),
                name=f"{prefix}_discard_matching",
            ),
            path(
                "failure-groups/",
                self.admin_site.admin_view(self.failure_groups_view),
                name=f"{prefix}_failure_groups",
            ),
            *super().get_urls(),
        ]

    @display(description="Status")
    def state(self, row: Any) -> str:
        return status_badge(row.status, discarded=row.discarded_at is not None)

    @display(description="Last error")
    def last_error_text(self, row: Any) -> str:
        return preformatted(row.last_error)

    @display(description="Payload")
    def payload_json(self, row: Any) -> str:
        return pretty_json(masked(row.payload, "payload"))

    @display(description="Headers")
    def headers_json(self, row: Any) -> str:
        return pretty_json(masked(row.headers, "headers"))

    @display(description="Payload and headers")
    def payload_hidden(self, row: Any) -> str:
        return "Hidden: seeing them needs the permission console.view_payload."

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """Without console.view_payload, the payload, the headers and a record's raw value
        give way to a line that says why they are not shown."""
        fieldsets = super().get_fieldsets(request, obj)
        if may_view_payload(request.user):
            return fieldsets
        shown = []
        for name, options in fieldsets:
            fields = [field for field in options["fields"] if field not in PAYLOAD_FIELDS]
            if len(fields) < len(options["fields"]):
                fields.append("payload_hidden")
            shown.append((name, {**options, "fields": tuple(fields)}))
        return shown

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Sequence[str]:
        return (*super().get_readonly_fields(request, obj), "payload_hidden")

    @display(description="Trace")
    def trace(self, row: Any) -> str | None:
        return trace_link(row.headers)

    def row_status(self, row: Any) -> str:
        """The row's status as the detail actions' pages and messages name it."""
        return str(row.status)

    def run_row_action(self, request: HttpRequest, row: Any, name: str) -> Any:
        """Runs the operator action `name` on one row; returns the row as it now is (for a
        replay with a new event id: the new row)."""
        raise NotImplementedError

    def detail_action(
        self, request: HttpRequest, object_id: str, name: str, verb: str
    ) -> HttpResponse:
        opts = self.model._meta
        # get_object answers None for a malformed id as for a missing one.
        row = self.get_object(request, object_id)
        if row is None:
            self.message_user(
                request, f"No {self.row_noun} with the id {object_id!r}.", messages.ERROR
            )
            return HttpResponseRedirect(
                reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
            )
        confirmation = detail_action_confirmation(
            self, request, row, verb=verb, status=self.row_status(row)
        )
        if confirmation is not None:
            return confirmation
        try:
            result = self.run_row_action(request, row, name)
        except (OutboxError, InboxError, ConsoleError) as error:
            self.message_user(request, str(error), messages.ERROR)
            return HttpResponseRedirect(
                reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[row.pk])
            )
        self.message_user(
            request,
            f"{verb}: {self.row_noun} {result.pk} is {self.row_status(result)}.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(
            reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[result.pk])
        )

    def retry_matching_view(self, request: HttpRequest) -> HttpResponse:
        return bulk_matching_view(
            self,
            request,
            action=self.retry_action,
            permission_check=self.has_retry_permission,
            verb="Retry",
            known_count=self.failure_group_count,
        )

    def discard_matching_view(self, request: HttpRequest) -> HttpResponse:
        return bulk_matching_view(
            self,
            request,
            action=self.discard_action,
            permission_check=self.has_discard_permission,
            verb="Discard",
            known_count=self.failure_group_count,
        )

    def failure_group_filters(
        self, *, error_class: str, topic: str, consumer_group: str
    ) -> dict[str, str]:
        """The list's filters that show one failure group's rows (its links)."""
        filters = {
            "status__exact": self.failure_group_status,
            "error_class": error_class,
            "topic": topic,
        }
        if consumer_group:
            filters["consumer_group"] = consumer_group
        return filters

    def failure_group_count(self, filters: dict[str, list[str]]) -> int | None:
        """The count of the failure group `filters` name (a group's retry or discard link), as
        the failure groups page counts it; None for any other filter."""
        if any(len(values) != 1 for values in filters.values()):
            return None
        named = {name: values[0] for name, values in filters.items()}
        group = {
            "error_class": named.get("error_class", ""),
            "topic": named.get("topic", ""),
            "consumer_group": named.get("consumer_group", ""),
        }
        if named != self.failure_group_filters(**group):
            return None
        return failure_group_count(self.failure_side, **group)

    def failure_groups_view(self, request: HttpRequest) -> HttpResponse:
        """FAILED rows grouped by error class and topic (and consumer group): each group's
        count, first and last seen, a sample, and "retry" / "discard this group", which
        confirm with the group's count first (the matching views) and are audited."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        opts = self.model._meta
        prefix = f"admin:{opts.app_label}_{opts.model_name}"
        groups = []
        for group in failure_groups(self.failure_side):
            filters = QueryDict(mutable=True)
            filters.update(
                self.failure_group_filters(
                    error_class=group.error_class,
                    topic=group.topic,
                    consumer_group=group.consumer_group,
                )
            )
            groups.append(
                {
                    "group": group,
                    "list_url": f"{reverse(f'{prefix}_changelist')}?{filters.urlencode()}",
                    "sample_url": reverse(f"{prefix}_change", args=[group.sample_id]),
                    "retry_url": f"{reverse(f'{prefix}_retry_matching')}?{filters.urlencode()}",
                    "discard_url": (
                        f"{reverse(f'{prefix}_discard_matching')}?{filters.urlencode()}"
                    ),
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "title": f"Failure groups: {opts.verbose_name_plural}",
            "opts": opts,
            "groups": groups,
            "grouped_by_consumer_group": self.failure_side == "inbox",
            "may_retry": self.has_retry_permission(request),
            "may_discard": self.has_discard_permission(request),
        }
        return TemplateResponse(request, "admin/console/failure_groups.html", context)
