from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_permission_codename
from django.db.models import Model
from rest_framework.permissions import BasePermission

from console.models import ApiToken

if TYPE_CHECKING:  # rest_framework.views imports this module through its settings
    from rest_framework.request import Request
    from rest_framework.views import APIView


def view_permission(model: type[Model]) -> str:
    """Django's default view permission of `model`, e.g. "outbox.view_outboxevent"."""
    opts = model._meta
    return f"{opts.app_label}.{get_permission_codename('view', opts)}"


class ConsolePermission(BasePermission):
    """An authenticated user, with the permissions the view names for the current action; a
    request with an API token needs them in the token's scope too (ApiToken.allows).

    A view declares `required_permissions = {"list": [...], "retry": [...], ...}` (keyed by
    ViewSet action, or "*" for any); the admin requires exactly the same permissions. An
    action with no entry is refused.
    """

    def has_permission(self, request: "Request", view: "APIView") -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if not hasattr(view, (request.method or "").lower()):
            return True  # no handler: DRF answers 405 Method Not Allowed next
        required: dict[str, list[str]] = getattr(view, "required_permissions", {})
        action = getattr(view, "action", None) or request.method or ""
        needed = required.get(action, required.get("*"))
        if needed is None:
            # An action the view names no permissions for is refused, not open to everyone.
            return False
        return self._granted(request, needed)

    def has_object_permission(self, request: "Request", view: "APIView", obj: Any) -> bool:
        if not self.has_permission(request, view):
            return False
        object_permissions = getattr(view, "object_permissions", None)
        return object_permissions is None or self._granted(request, object_permissions(obj))

    @staticmethod
    def _granted(request: "Request", needed: list[str]) -> bool:
        if isinstance(request.auth, ApiToken) and not request.auth.allows(needed):
            return False
        return bool(request.user.has_perms(needed))
