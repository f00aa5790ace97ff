"""Login protection (django-axes): the lock-outs in force, with an audited unlock that needs its
own permission, every failed login, and the successful logins and logouts. All read-only:
axes writes these rows; an operator only unlocks (console.logins)."""

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from unfold.contrib.filters.admin import RangeDateTimeFilter
from unfold.decorators import action, display

from console.admin.base import (
    EstimatedCountPaginator,
    ReadOnlyModelAdmin,
    detail_action_confirmation,
)
from console.logins import login_lockout_unlock, login_lockouts_with_state
from console.models import FailedLogin, Login, LoginLockout, OperatorAction, SecurityPermission
from console.operations import ConsoleError

LOCKOUTS = "admin:console_loginlockout_changelist"


class LockedNowFilter(admin.SimpleListFilter):
    title = "locked now"
    parameter_name = "locked_now"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Locked now"), ("no", "Not locked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(locked_now=True)
        if self.value() == "no":
            return queryset.filter(locked_now=False)
        return queryset


def _unlock_message(record: OperatorAction) -> str:
    return f"{record.note} Failure counts cleared: {record.changed} (audit #{record.pk})."


@admin.register(LoginLockout)
class LoginLockoutAdmin(ReadOnlyModelAdmin):
    """Failed logins counted per user name, address and user agent. A row is locked now when
    its user name or its address is locked out (the failures of all their rows within the
    cool-off reach the limit); unlocking it clears both."""

    list_display = (
        "username",
        "ip_address",
        "failures_since_start",
        "first_failure_at",
        "last_failure_at",
        "locked",
        "locked_until_at",
    )
    list_filter = (LockedNowFilter,)
    search_fields = ("username", "ip_address")
    search_help_text = "A user name or an address."
    ordering = ("-attempt_time",)
    actions = ("unlock_selected",)
    actions_detail = ("unlock_detail",)
    fieldsets = (
        (
            "Login",
            {"fields": ("username", "ip_address", "user_agent", "path_info", "failed_logins")},
        ),
        (
            "Lock-out",
            {
                "fields": (
                    "failures_since_start",
                    "first_failure_at",
                    "last_failure_at",
                    "locked",
                    "locked_until_at",
                )
            },
        ),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The form data axes keeps (user name, masked password) is never shown.
        rows = super().get_queryset(request).defer("get_data", "post_data")
        return login_lockouts_with_state(rows)

    def has_unlock_permission(self, request: HttpRequest, object_id: Any = None) -> bool:
        return bool(request.user.has_perm(SecurityPermission.UNLOCK_LOGIN))

    @display(description="First failure")
    def first_failure_at(self, row: Any) -> Any:
        return row.first_failure or "-"

    @display(description="Last failure", ordering="attempt_time")
    def last_failure_at(self, row: Any) -> Any:
        return row.attempt_time

    @display(description="Locked now", boolean=True)
    def locked(self, row: Any) -> bool:
        return bool(row.locked_now)

    @display(description="Locked until")
    def locked_until_at(self, row: Any) -> Any:
        if not row.locked_now:
            return "-"
        return row.locked_until or "until unlocked"

    @display(description="Failed logins")
    def failed_logins(self, row: Any) -> str:
        url = reverse("admin:console_failedlogin_changelist")
        return format_html(
            '<a href="{}?{}">Every failed login of this user name</a>',
            url,
            urlencode({"q": row.username or ""}),
        )

    def _unlock(self, request: HttpRequest, attempt_ids: list[int]) -> OperatorAction | None:
        try:
            record = login_lockout_unlock(
                user=request.user, attempt_ids=attempt_ids, source=OperatorAction.Source.ADMIN
            )
        except ConsoleError as error:
            self.message_user(request, str(error), messages.ERROR)
            return None
        self.message_user(request, _unlock_message(record), messages.SUCCESS)
        return record

    @action(description="Unlock selected logins", permissions=["unlock"])
    def unlock_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._unlock(request, list(queryset.values_list("pk", flat=True)))

    @action(description="Unlock", url_path="unlock", permissions=["unlock"])
    def unlock_detail(self, request: HttpRequest, object_id: str) -> HttpResponse:
        row = self.get_object(request, object_id)
        if row is None:
            self.message_user(request, f"No lock-out with the id {object_id!r}.", messages.ERROR)
            return HttpResponseRedirect(reverse(LOCKOUTS))
        if row.locked_now and row.locked_until:
            state = f"locked until {row.locked_until:%Y-%m-%d %H:%M:%S %Z}"
        elif row.locked_now:
            state = "locked until unlocked"
        else:
            state = "not locked now"
        confirmation = detail_action_confirmation(
            self, request, row, verb="Unlock", status=f"{state} ({row.username}, {row.ip_address})"
        )
        if confirmation is not None:
            return confirmation
        self._unlock(request, [row.pk])
        return HttpResponseRedirect(reverse(LOCKOUTS))


class AccessRecordAdmin(ReadOnlyModelAdmin):
    """Rows axes appends on every login: newest first, never counted in full."""

    title: str
    search_fields = ("username", "ip_address")
    search_help_text = "A user name or an address."
    ordering = ("-attempt_time",)
    list_filter_submit = True
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().changelist_view(request, {"title": self.title, **(extra_context or {})})


@admin.register(FailedLogin)
class FailedLoginAdmin(AccessRecordAdmin):
    title = "Failed logins"
    list_display = (
        "attempt_time",
        "username",
        "ip_address",
        "locked_out",
        "user_agent",
        "path_info",
    )
    list_filter = ("locked_out", ("attempt_time", RangeDateTimeFilter))
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "attempt_time",
                    "username",
                    "ip_address",
                    "locked_out",
                    "user_agent",
                    "path_info",
                    "http_accept",
                )
            },
        ),
    )


@admin.register(Login)
class LoginAdmin(AccessRecordAdmin):
    title = "Logins"
    list_display = ("attempt_time", "logout_time", "username", "ip_address", "user_agent")
    list_filter = (("attempt_time", RangeDateTimeFilter),)
    # The hash of the session key is left out: it identifies a live session.
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "attempt_time",
                    "logout_time",
                    "username",
                    "ip_address",
                    "user_agent",
                    "path_info",
                    "http_accept",
                )
            },
        ),
    )
