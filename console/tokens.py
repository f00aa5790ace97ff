"""Writes of the console's API tokens: creation (the token is returned once, only its SHA-512
digest is stored) and revocation, each checked against the operator's permissions and written
to the audit log. The audit names a token by its name, user and stored prefix, never by the
token itself."""

from collections.abc import Iterable
from datetime import timedelta
from typing import Any, cast

from django.conf import settings
from django.db import transaction

from console.audit import operator_action_record
from console.models import ACTION_PERMISSIONS, ApiToken, OperatorAction
from console.operations import ConsoleError, NotPermitted, require_permission

Action = OperatorAction.Action

TOKEN_ADD_PERMISSION = "console.add_apitoken"  # noqa: S105 (a permission name)
TOKEN_DELETE_PERMISSION = "console.delete_apitoken"  # noqa: S105 (a permission name)
# No token lives longer than this; a longer-lived credential belongs in a secret store that
# rotates it.
API_TOKEN_MAX_LIFETIME = timedelta(days=365)


class InvalidApiToken(ConsoleError):
    code = "invalid_api_token"


def api_token_default_lifetime() -> timedelta:
    """API_TOKEN_TTL_DAYS, the lifetime of a token when its creator names none."""
    return cast(timedelta, settings.REST_KNOX["TOKEN_TTL"])


def api_token_scope_text(*, token: ApiToken) -> str:
    """The scope as the console lists it: read-only, all actions, or the actions' names."""
    if ApiToken.ALL_ACTIONS in token.actions:
        return f"all actions of {token.user.get_username()}"
    if not token.actions:
        return "read-only"
    return ", ".join(str(action) for action in token.actions)


def _token_description(token: ApiToken) -> str:
    expiry = f"{token.expiry:%Y-%m-%d %H:%M} UTC" if token.expiry else "never"
    return (
        f"{token.name!r} ({token.token_key}...) of {token.user.get_username()}, expiry {expiry}, "
        f"scope: {api_token_scope_text(token=token)}"
    )


def api_token_create(
    *,
    user: Any,
    created_by: Any,
    name: str,
    expires_in: timedelta | None,
    actions: list[str],
    source: str = OperatorAction.Source.ADMIN,
) -> tuple[ApiToken, str]:
    """Creates a token for `user` and returns it with the token text, which is stored nowhere:
    the caller shows it once. `expires_in` None takes API_TOKEN_TTL_DAYS; every token expires,
    at most API_TOKEN_MAX_LIFETIME from now. `actions` is the scope: [] (read-only),
    [ApiToken.ALL_ACTIONS], or names of ACTION_PERMISSIONS; the user's own permissions are
    checked on each request as well. Only a superuser creates tokens for other users."""
    require_permission(created_by, TOKEN_ADD_PERMISSION)
    if user.pk != created_by.pk and not created_by.is_superuser:
        raise NotPermitted("Only a superuser creates API tokens for other users.")
    if not user.is_active:
        raise InvalidApiToken(f"The user {user.get_username()} is inactive; activate it first.")
    name = name.strip()
    if not name:
        raise InvalidApiToken("A token needs a name that says what uses it.")
    lifetime = api_token_default_lifetime() if expires_in is None else expires_in
    if not timedelta(0) < lifetime <= API_TOKEN_MAX_LIFETIME:
        raise InvalidApiToken(
            f"A token expires within {API_TOKEN_MAX_LIFETIME.days} days of its creation; "
            f"{lifetime} is not allowed."
        )
    scope = list(dict.fromkeys(actions))
    unknown = [action for action in scope if action not in ACTION_PERMISSIONS]
    if scope != [ApiToken.ALL_ACTIONS] and unknown:
        raise InvalidApiToken(
            f"Not an action of a token's scope: {', '.join(map(str, unknown))}. Choose from "
            f"{', '.join(ACTION_PERMISSIONS)}, or {ApiToken.ALL_ACTIONS!r} alone for all."
        )
    with transaction.atomic():
        token, text = ApiToken.objects.create(user=user, expiry=lifetime, name=name, actions=scope)
        operator_action_record(
            user=created_by,
            action=Action.TOKEN_CREATE,
            model=ApiToken._meta.label,
            source=source,
            requested=1,
            changed=1,
            object_ids=[token.token_key],
            note=f"Created {_token_description(token)}.",
        )
    return token, text


def api_token_revoke(*, tokens: Iterable[ApiToken], revoked_by: Any, source: str) -> int:
    """Deletes `tokens` (a request with one of them is refused from then on) and returns how
    many were deleted; one audit entry names them all."""
    require_permission(revoked_by, TOKEN_DELETE_PERMISSION)
    with transaction.atomic():
        chosen = {token.pk for token in tokens}
        # Locked and read again: a token deleted meanwhile (revoked, or expired and cleaned
        # up by a request) is not counted twice.
        rows = list(
            ApiToken.objects.select_for_update(of=("self",))
            .select_related("user")
            .filter(pk__in=chosen)
            .order_by("created")
        )
        deleted, _ = ApiToken.objects.filter(pk__in=[row.pk for row in rows]).delete()
        descriptions = "; ".join(_token_description(row) for row in rows)
        operator_action_record(
            user=revoked_by,
            action=Action.TOKEN_REVOKE,
            model=ApiToken._meta.label,
            source=source,
            requested=len(chosen),
            changed=deleted,
            object_ids=[row.token_key for row in rows],
            note=f"Revoked {descriptions}." if rows else "Nothing to revoke.",
        )
    return deleted
