from django.conf import settings
from django.db import models
from django.utils import timezone


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
