"""Login lock-outs (django-axes' failure counts): which are in force and until when, and their
unlocking by an operator, audited.

Axes counts failed logins per user name and, apart, per client address
(AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]); each AccessAttempt row holds the
failures of one (user name, address, user agent) since its first, and its `attempt_time` is
that of its latest failure. A user name (an address) is locked out while the failures of its
rows whose latest failure is within the cool-off reach AXES_FAILURE_LIMIT."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_cool_off, get_failure_limit
from axes.models import AccessAttempt, AccessFailureLog
from django.db import transaction
from django.db.models import (
    BooleanField,
    DateTimeField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    Window,
)
from django.db.models.functions import Greatest, RowNumber
from django.utils import timezone

from console.audit import operator_action_record
from console.models import OperatorAction, SecurityPermission
from console.operations import model_label, require_permission


def _lock_reached_at(field: str, *, limit: int, since: datetime | None) -> Subquery:
    """The latest failure time at which the failures counted against the row's `field` (its
    user name or its address), newest first, reach `limit`; None while they do not. The
    lock-out lasts until that time plus the cool-off: newer failures alone stay under the
    limit, so it ends when this one leaves the cool-off window (unless more failures come)."""
    counted = AccessAttempt.objects.filter(**{field: OuterRef(field)})
    if since is not None:
        counted = counted.filter(attempt_time__gte=since)
    reaching = (
        counted.annotate(
            running=Window(Sum("failures_since_start"), order_by=F("attempt_time").desc())
        )
        .filter(running__gte=limit)
        .order_by("-attempt_time")
        .values("attempt_time")[:1]
    )
    return Subquery(reaching, output_field=DateTimeField())


def _first_failure() -> Subquery:
    """When the row's first counted failure happened (the row keeps only its latest): the
    oldest of the `failures_since_start` newest failure-log entries of its user name, address
    and user agent. Axes logs every failure it counts, right after counting it, and a failure
    of theirs while the row exists is counted in it, so those entries are the row's. None
    when the log has been trimmed below that (axes keeps at most
    AXES_ACCESS_FAILURE_LOG_PER_USER_LIMIT entries per user name)."""
    ranked = (
        AccessFailureLog.objects.filter(
            username=OuterRef("username"),
            ip_address=OuterRef("ip_address"),
            user_agent=OuterRef("user_agent"),
        )
        .annotate(rank=Window(RowNumber(), order_by=F("attempt_time").desc()))
        .filter(rank=OuterRef("failures_since_start"))
        .values("attempt_time")[:1]
    )
    return Subquery(ranked, output_field=DateTimeField())


def login_lockouts_with_state(
    queryset: QuerySet[Any], *, now: datetime | None = None
) -> QuerySet[Any]:
    """`queryset` of AccessAttempt rows with `locked_now` (the row's user name or its address
    is locked out now), `locked_until` (when that lock-out ends unless more failures come;
    None when not locked, or when no cool-off is configured and only an unlock ends it) and
    `first_failure`. The project configures the failure limit and the cool-off as values,
    not as callables of the request."""
    now = now or timezone.now()
    limit = get_failure_limit(None, None)
    cool_off = get_cool_off(None)
    since = now - cool_off if cool_off else None
    rows = queryset.annotate(
        user_lock_reached_at=_lock_reached_at("username", limit=limit, since=since),
        address_lock_reached_at=_lock_reached_at("ip_address", limit=limit, since=since),
        first_failure=_first_failure(),
    ).annotate(
        locked_now=ExpressionWrapper(
            Q(user_lock_reached_at__isnull=False) | Q(address_lock_reached_at__isnull=False),
            output_field=BooleanField(),
        ),
    )
    if cool_off is None:
        return rows.annotate(locked_until=Value(None, output_field=DateTimeField()))
    # PostgreSQL's GREATEST skips NULLs: the later of the two lock-outs in force.
    return rows.annotate(
        locked_until=ExpressionWrapper(
            Greatest("user_lock_reached_at", "address_lock_reached_at") + Value(cool_off),
            output_field=DateTimeField(),
        )
    )


def login_lockout_unlock(
    *, user: Any, attempt_ids: Sequence[int], source: str, note: str = ""
) -> OperatorAction:
    """Unlocks the user names and the addresses of the AccessAttempt rows `attempt_ids`: clears
    every failure counted against them through axes' own reset, so each such user may log in
    again from each such address at once, and writes one audit entry (its `changed` counts
    the rows cleared, its `object_ids` names them). Failures counted against another user
    name from one of these addresses are cleared with the address; the failure log keeps
    every attempt."""
    require_permission(user, SecurityPermission.UNLOCK_LOGIN)
    requested = sorted(set(attempt_ids))
    with transaction.atomic():
        selected = list(
            AccessAttempt.objects.filter(pk__in=requested)
            .order_by("pk")
            .values_list("username", "ip_address")
        )
        # A NULL never names a lock-out here: axes' reset would match every row lacking it.
        usernames = sorted({username for username, _ in selected if username is not None})
        addresses = sorted({address for _, address in selected if address is not None})
        cleared_ids = list(
            AccessAttempt.objects.filter(Q(username__in=usernames) | Q(ip_address__in=addresses))
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        cleared = sum(AxesProxyHandler.reset_attempts(username=name) for name in usernames)
        cleared += sum(AxesProxyHandler.reset_attempts(ip_address=ip) for ip in addresses)
        described = (
            f"Unlocked user names: {', '.join(usernames) or '-'}; "
            f"addresses: {', '.join(addresses) or '-'}."
        )
        return operator_action_record(
            user=user,
            action=OperatorAction.Action.LOGIN_UNLOCK,
            model=model_label(AccessAttempt),
            source=source,
            requested=len(requested),
            changed=cleared,
            object_ids=cleared_ids,
            note=f"{described} {note}".strip(),
        )
