"""The API tokens' console: list, create (the token is shown once, in the answer to the form),
look at (read-only: a token is never edited) and revoke. Creation and revocation go through
console.tokens and are written to the audit log; only digests are stored, so no page can show
a token again."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import ForeignKey, QuerySet
from django.forms import ModelChoiceField
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from unfold.admin import ModelAdmin
from unfold.decorators import action, display
from unfold.widgets import (
    UnfoldAdminCheckboxSelectMultipleWidget,
    UnfoldAdminIntegerFieldWidget,
    UnfoldAdminRadioSelectWidget,
)

from analytics.models import AnalyticsRunPermission
from console.models import ACTION_PERMISSIONS, ApiToken, OperatorAction
from console.tokens import (
    API_TOKEN_MAX_LIFETIME,
    api_token_create,
    api_token_default_lifetime,
    api_token_revoke,
    api_token_scope_text,
)
from inbox.models import InboxMessagePermission
from outbox.models import OutboxEventPermission

ADMIN = OperatorAction.Source.ADMIN
ACTION_LABELS = {
    str(permission): str(permission.label)
    for choices in (OutboxEventPermission, InboxMessagePermission, AnalyticsRunPermission)
    for permission in choices
}
# The request attribute that carries a new token from save_model to the page that shows it:
# never stored, never put in a message or a redirect.
SHOWN_ONCE = "_console_api_token_shown_once"


class Scope:
    """The three kinds of scope the form offers."""

    READ_ONLY = "read_only"
    ALL_ACTIONS = "all_actions"
    CHOSEN = "chosen"
    choices = (
        (READ_ONLY, "Read-only: lists, details and statistics"),
        (ALL_ACTIONS, "All actions the user may perform"),
        (CHOSEN, "Only the actions ticked below"),
    )


class ApiTokenCreateForm(forms.ModelForm):
    """Name and user (model fields), expiry in days and the scope. Tokens are immutable, so
    this form only ever adds one."""

    expires_in_days = forms.IntegerField(
        label="Expires in (days)",
        min_value=1,
        max_value=API_TOKEN_MAX_LIFETIME.days,
        widget=UnfoldAdminIntegerFieldWidget,
        help_text=(
            f"Every token expires, at most {API_TOKEN_MAX_LIFETIME.days} days from now; "
            "create a new one before then."
        ),
    )
    scope = forms.ChoiceField(
        choices=Scope.choices, initial=Scope.READ_ONLY, widget=UnfoldAdminRadioSelectWidget
    )
    chosen_actions = forms.MultipleChoiceField(
        label="Actions",
        required=False,
        choices=[(permission, ACTION_LABELS[permission]) for permission in ACTION_PERMISSIONS],
        widget=UnfoldAdminCheckboxSelectMultipleWidget,
        help_text=(
            "A request with the token may do what both the scope and the user's permissions "
            "allow, checked on every request."
        ),
    )

    class Meta:
        model = ApiToken
        fields = ("name", "user")
        help_texts = {"name": "What uses the token, e.g. 'CI deploy' or 'Grafana'."}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["expires_in_days"].initial = api_token_default_lifetime().days

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        chosen = cleaned.get("chosen_actions") or []
        if cleaned.get("scope") == Scope.CHOSEN and not chosen:
            self.add_error("chosen_actions", "Tick at least one action, or choose read-only.")
        elif cleaned.get("scope") in (Scope.READ_ONLY, Scope.ALL_ACTIONS) and chosen:
            self.add_error(
                "chosen_actions",
                "Actions are ticked but the scope is not 'only the actions ticked below': "
                "choose that scope, or untick them.",
            )
        return cleaned

    def token_actions(self) -> list[str]:
        scope = self.cleaned_data["scope"]
        if scope == Scope.ALL_ACTIONS:
            return [ApiToken.ALL_ACTIONS]
        if scope == Scope.CHOSEN:
            return list(self.cleaned_data["chosen_actions"])
        return []


def actions_lacking(token: ApiToken) -> list[str]:
    """The actions of a chosen scope that the token's user may not perform (now)."""
    if ApiToken.ALL_ACTIONS in token.actions:
        return []
    return [action for action in token.actions if not token.user.has_perm(action)]


class ExpiredFilter(admin.SimpleListFilter):
    title = "expired"
    parameter_name = "expired"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Sequence[tuple[str, str]]:
        return (("yes", "Yes"), ("no", "No"))

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        now = timezone.now()
        if self.value() == "yes":
            return queryset.filter(expiry__lte=now)
        if self.value() == "no":
            return queryset.exclude(expiry__lte=now)
        return queryset


@admin.register(ApiToken)
class ApiTokenAdmin(ModelAdmin):
    """Anyone with console.add_apitoken creates tokens for themselves, a superuser for any
    user; console.delete_apitoken revokes any token (a leaked one is found by its prefix).
    There is no change form: a token's user, scope and expiry are fixed when it is made."""

    form = ApiTokenCreateForm
    list_display = ("name", "user", "prefix", "created", "expiry", "expired", "scope")
    list_filter = (ExpiredFilter,)
    list_select_related = ("user",)
    search_fields = ("name", "user__username", "token_key")
    search_help_text = "A name, a user name, or the token's first characters (console_...)."
    actions = ("revoke_selected",)
    add_fields = ("name", "user", "expires_in_days", "scope", "chosen_actions")
    fieldsets = (
        ("Token", {"fields": ("name", "user", "prefix", "created", "expiry", "expired")}),
        ("Access", {"fields": ("scope", "scope_note")}),
    )
    readonly_fields = ("prefix", "expired", "scope", "scope_note")

    # --- permissions and forms ---------------------------------------------------------------

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ((None, {"fields": self.add_fields}),)
        return self.fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Sequence[str]:
        if obj is None:
            return ()
        return ("name", "user", "created", "expiry", *self.readonly_fields)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        found = super().get_actions(request)
        found.pop("delete_selected", None)  # "Revoke" does it, and says so
        return found

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {"user": request.user.pk}

    def formfield_for_foreignkey(
        self, db_field: ForeignKey, request: HttpRequest, **kwargs: Any
    ) -> ModelChoiceField | None:
        if db_field.name == "user":
            users = get_user_model().objects.filter(is_active=True)
            if not request.user.is_superuser:
                users = users.filter(username=request.user.get_username())
            kwargs["queryset"] = users.order_by("username")
            kwargs["help_text"] = (
                "Whose permissions the token carries."
                if request.user.is_superuser
                else "You create tokens for yourself; a superuser creates them for others."
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        # A token's page shows its fields read-only: no form fields at all.
        kwargs["form"] = ApiTokenCreateForm if obj is None else forms.ModelForm
        return super().get_form(request, obj, change=change, **kwargs)

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = {
            **(extra_context or {}),
            "title": "Create an API token",
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
        }
        return super().add_view(request, form_url, extra_context)

    # --- creation and revocation -------------------------------------------------------------

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        token, text = api_token_create(
            user=form.cleaned_data["user"],
            created_by=request.user,
            name=form.cleaned_data["name"],
            expires_in=timedelta(days=form.cleaned_data["expires_in_days"]),
            actions=form.token_actions(),
            source=ADMIN,
        )
        # The admin goes on with `obj` (its history entry, the page below): it becomes the row.
        for field in ApiToken._meta.concrete_fields:
            setattr(obj, field.attname, getattr(token, field.attname))
        obj._state.adding = False
        obj._state.db = token._state.db
        setattr(request, SHOWN_ONCE, text)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """A token has no related rows to save."""

    def response_add(
        self, request: HttpRequest, obj: Any, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The page that shows the new token, the one time it exists in clear: the answer to
        the form's POST itself (the admin's views are never cached)."""
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": "API token created",
            "opts": opts,
            "token": obj,
            "token_text": getattr(request, SHOWN_ONCE),
            "scope": api_token_scope_text(token=obj),
            "lacking": actions_lacking(obj),
            "list_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"),
        }
        return TemplateResponse(request, "admin/console/api_token_created.html", context)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        api_token_revoke(tokens=[obj], revoked_by=request.user, source=ADMIN)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        api_token_revoke(tokens=queryset, revoked_by=request.user, source=ADMIN)

    @action(description="Revoke the selected tokens", permissions=["delete"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        revoked = api_token_revoke(tokens=queryset, revoked_by=request.user, source=ADMIN)
        self.message_user(
            request,
            f"Revoked {revoked} API token(s): requests with them are refused from now on.",
            messages.SUCCESS,
        )

    # --- columns and fields ------------------------------------------------------------------

    @display(description="Token")
    def prefix(self, token: ApiToken) -> str:
        return f"{token.token_key}..."

    @display(description="Expired", boolean=True)
    def expired(self, token: ApiToken) -> bool:
        expiry: datetime | None = token.expiry
        return expiry is not None and expiry <= timezone.now()

    @display(description="Scope")
    def scope(self, token: ApiToken) -> str:
        return api_token_scope_text(token=token)

    @display(description="Note")
    def scope_note(self, token: ApiToken) -> str:
        lacking = actions_lacking(token)
        if not lacking:
            return "-"
        return (
            f"{token.user.get_username()} lacks the permission of {', '.join(lacking)}: "
            "requests with the token cannot perform these actions unless the user gets it."
        )
