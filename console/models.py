from collections.abc import Iterable

from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.conf import settings
from django.db import models
from django.utils import timezone
from knox.models import AbstractAuthToken

from analytics.models import AnalyticsRunPermission
from inbox.models import InboxMessagePermission
from outbox.models import OutboxEventPermission


class SecurityPermission(models.TextChoices):
    """The permissions of the console's security pages, declared once."""

    UNLOCK_LOGIN = "console.unlock_login", "Can unlock a locked-out login"


# What an API token's scope may grant besides reading: the console's operator actions.
ACTION_PERMISSIONS = tuple(
    permission.value
    for choices in (OutboxEventPermission, InboxMessagePermission, AnalyticsRunPermission)
    for permission in choices
)


class ApiToken(AbstractAuthToken):
    """An API token (django-rest-knox's model, with a name and a scope): only the SHA-512 digest
    of the token and its first characters are stored; the token itself is shown once, when it
    is created (console.tokens). Its request is allowed what both its user's permissions and
    its scope allow: reading wherever the user may read, and of the operator actions
    (ACTION_PERMISSIONS) only those in `actions` (empty: read-only; ALL_ACTIONS: every one the
    user may perform). Any other permission (managing tokens, unlocking logins) is never a
    token's: such pages are for an operator's session."""

    ALL_ACTIONS = "*"

    name = models.CharField(max_length=100)
    actions = models.JSONField(default=list, blank=True)

    class Meta:
        db_table = "console_api_token"
        verbose_name = "API token"
        ordering = ("-created",)

    def __str__(self) -> str:
        return f"{self.name} ({self.token_key}...)"

    def allows(self, permissions: Iterable[str]) -> bool:
        """Whether the scope covers `permissions` (the user's own are checked apart)."""
        return all(self._allows(str(permission)) for permission in permissions)

    def _allows(self, permission: str) -> bool:
        if permission.partition(".")[2].startswith("view_"):
            return True
        if permission not in ACTION_PERMISSIONS:
            return False
        return self.ALL_ACTIONS in self.actions or permission in self.actions


class LoginLockout(AccessAttempt):
    """Failed logins counted per user name or client address (django-axes' AccessAttempt): the
    console lists them and unlocks a locked-out one with its own permission."""

    class Meta:
        proxy = True
        verbose_name = "login lock-out"
        default_permissions = ("view",)
        permissions = (
            (
                SecurityPermission.UNLOCK_LOGIN.value.partition(".")[2],
                SecurityPermission.UNLOCK_LOGIN.label,
            ),
        )

    def __str__(self) -> str:
        return f"{self.username or '-'} from {self.ip_address or '-'}"


class FailedLogin(AccessFailureLog):
    """Every failed login (django-axes' AccessFailureLog), under the console's name."""

    class Meta:
        proxy = True
        verbose_name = "failed login"
        default_permissions = ("view",)


class Login(AccessLog):
    """Every login and logout (django-axes' AccessLog), under the console's name."""

    class Meta:
        proxy = True
        verbose_name = "login"
        default_permissions = ("view",)


class OperatorAction(models.Model):
    """The console's audit log: one row per operator action, from the admin or the API, on
    outbox events, inbox messages or analytics runs. The permissions of the actions live on
    the models they guard (OutboxEventPermission, InboxMessagePermission,
    AnalyticsRunPermission)."""

    class Action(models.TextChoices):
        OUTBOX_RETRY = "outbox.retry", "Retry outbox events"
        OUTBOX_DISCARD = "outbox.discard", "Discard outbox events"
        OUTBOX_REPLAY = "outbox.replay", "Replay outbox events (same event id)"
        OUTBOX_REPLAY_NEW_ID = "outbox.replay_new_id", "Replay outbox events (new event id)"
        OUTBOX_KEY_RELEASE = "outbox.release_key", "Release a quarantined key"
        INBOX_RETRY = "inbox.retry", "Retry inbox messages"
        INBOX_REPLAY = "inbox.replay", "Replay inbox messages"
        INBOX_DISCARD = "inbox.discard", "Discard inbox messages"
        INBOX_SEQUENCE_RETRY = "inbox.retry_sequence", "Retry the sequence of a held key"
        INBOX_SKIP_HEAD = "inbox.skip_head", "Skip the head of a held key"
        INBOX_KEY_RELEASE = "inbox.release_key", "Release a held key"
        ANALYTICS_RUN = "analytics.run", "Start an analytics run"
        LOGIN_UNLOCK = "security.unlock_login", "Unlock a locked-out login"
        TOKEN_CREATE = "security.create_token", "Create an API token"
        TOKEN_REVOKE = "security.revoke_token", "Revoke an API token"
        BULK_CANCEL = "console.cancel_bulk", "Cancel a bulk operation"

    class Source(models.TextChoices):
        ADMIN = "admin", "Admin"
        API = "api", "API"

    # Ids kept per row; a bulk action over more rows keeps its filter and its count.
    MAX_STORED_IDS = 1000

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text too: the log outlives a deleted user.
    username = models.CharField(max_length=150)
    action = models.CharField(max_length=32, choices=Action.choices)
    model = models.CharField(max_length=64)
    source = models.CharField(max_length=8, choices=Source.choices)
    # Rows the operator asked for (ids frozen at submit), and rows the services changed.
    requested = models.PositiveIntegerField(default=0)
    changed = models.PositiveIntegerField(default=0)
    object_ids = models.JSONField(default=list, blank=True)
    filters = models.JSONField(default=dict, blank=True)
    note = models.TextField(blank=True, default="")
    # Why the operator ran it: required of every bulk action (console.bulk), so that the log
    # answers "why were 100,000 events retried at 3 a.m." without asking around.
    reason = models.TextField(blank=True, default="")
    # Chunks still queued in Celery for a large action; 0 when it is complete.
    chunks_pending = models.PositiveIntegerField(default=0)

    class Meta:
        # The table the outbox app created when the audit log lived there: kept, with its rows.
        db_table = "outbox_operator_action"
        ordering = ("-created_at",)
        default_permissions = ("view",)

    def __str__(self) -> str:
        return (
            f"{self.username} {self.action} x{self.requested} at {self.created_at:%Y-%m-%d %H:%M}"
        )


class BulkOperation(models.Model):
    """A bulk action over more rows than one chunk: its ids are frozen at submit into chunks
    (BulkOperationChunk), which a Celery task applies one transaction at a time under a rate
    cap, counting its progress here; an operator can cancel it between two chunks. Its audit
    entry (who, what, why, the filter) is `audit`."""

    class Status(models.TextChoices):
        QUEUED = "QUEUED", "Queued"
        RUNNING = "RUNNING", "Running"
        DONE = "DONE", "Done"
        CANCELLED = "CANCELLED", "Cancelled"
        FAILED = "FAILED", "Failed"

    FINISHED = (Status.DONE, Status.CANCELLED, Status.FAILED)

    audit = models.OneToOneField(
        OperatorAction, on_delete=models.CASCADE, related_name="bulk_operation"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    chunks_total = models.PositiveIntegerField(default=0)
    chunks_done = models.PositiveIntegerField(default=0)
    # Rows of the chunks applied so far, and how many of them the services changed (a row
    # no longer in a state the action applies to is skipped).
    rows_done = models.PositiveIntegerField(default=0)
    rows_changed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=150, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # Times a run whose worker died was queued again (console.bulk_operations.
    # bulk_operations_reap): past CONSOLE_BULK_MAX_RESUMES, the operation fails instead.
    resumes = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "console_bulk_operation"
        ordering = ("-created_at",)
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"bulk operation {self.pk} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED


class BulkOperationChunk(models.Model):
    """One chunk of a bulk operation's frozen ids, waiting to be applied: the transaction that
    applies it deletes it, so a chunk runs once even when its task is delivered again."""

    operation = models.ForeignKey(BulkOperation, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    object_ids = models.JSONField()

    class Meta:
        db_table = "console_bulk_operation_chunk"
        ordering = ("operation", "index")
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=("operation", "index"), name="bulk_chunk_unique_index")
        ]

    def __str__(self) -> str:
        return f"chunk {self.index} of bulk operation {self.operation_id}"


class ConsoleAccess(models.Model):
    """No table: it carries the console's permissions that guard no model of their own."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = (("view_payload", "Can see the payloads and headers of events and messages"),)

    def __str__(self) -> str:
        return "console permissions"
