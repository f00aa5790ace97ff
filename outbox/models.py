import uuid

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.utils import timezone

# Allocated by PostgreSQL at insert; orders the events of one key (see OutboxEvent.position).
POSITION_SEQUENCE = "outbox_event_position_seq"


class OutboxEvent(models.Model):
    """An event recorded in the business transaction, waiting for or done with publication.

    The columns of id, aggregate type, aggregate id, event type and payload carry the names
    Debezium's Outbox Event Router reads, so a deployment can swap the relay for CDC.
    """

    class Status(models.TextChoices):
        PENDING = "PENDING", "Pending"
        DONE = "DONE", "Done"
        FAILED = "FAILED", "Failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False, db_column="id")
    aggregate_type = models.CharField(max_length=255, db_column="aggregatetype")
    aggregate_id = models.CharField(max_length=255, db_column="aggregateid")
    event_type = models.CharField(max_length=255, db_column="type")
    payload = models.JSONField(encoder=DjangoJSONEncoder, db_column="payload")
    headers = models.JSONField(default=dict, blank=True)
    topic = models.CharField(max_length=249)
    key = models.CharField(max_length=255)
    status = models.CharField(max_length=7, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    published_at = models.DateTimeField(null=True, blank=True)
    kafka_partition = models.IntegerField(null=True, blank=True)
    kafka_offset = models.BigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Creation order from a database sequence: the relay publishes the events of one
    # (topic, key) strictly in this order, whatever the clocks of the writing processes say.
    position = models.BigIntegerField(
        db_default=models.Func(models.Value(POSITION_SEQUENCE), function="nextval"),
        editable=False,
    )
    # Set when an operator discards a FAILED event: kept for audit, it no longer holds back
    # the later events of its key.
    discarded_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The lease of the relay that claimed the row; expired leases are claimable again.
    locked_until = models.DateTimeField(null=True, blank=True, editable=False)
    locked_by = models.CharField(max_length=255, blank=True, default="", editable=False)

    class Meta:
        db_table = "outbox_event"
        ordering = ("-created_at",)
        indexes = (
            # The relay's claim: due PENDING rows in creation order.
            models.Index(
                fields=("position",),
                name="outbox_event_pending_idx",
                condition=Q(status="PENDING"),
            ),
            # The per-key order check and the quarantine list: rows not yet DONE, by key.
            models.Index(
                fields=("topic", "key", "position"),
                name="outbox_event_undelivered_idx",
                condition=~Q(status="DONE") & Q(discarded_at__isnull=True),
            ),
            # Every index is written again when a row is marked DONE (not a HOT update), so
            # the list stays short: lists filter by status or event type on top of these.
            models.Index(fields=("created_at",), name="outbox_event_created_idx"),
            models.Index(
                fields=("topic", "status", "created_at"), name="outbox_event_console_topic_idx"
            ),
            models.Index(fields=("published_at",), name="outbox_event_published_idx"),
            models.Index(fields=("aggregate_type", "aggregate_id"), name="outbox_event_aggr_idx"),
            models.Index(fields=("key",), name="outbox_event_key_idx"),
            # An event type filter on the console: a rare type would otherwise walk the
            # created_at index through the whole table to fill one page.
            models.Index(fields=("event_type", "created_at"), name="outbox_event_type_idx"),
        )

    def __str__(self) -> str:
        return f"{self.event_type} {self.id} ({self.status})"


class OperatorAction(models.Model):
    """The console's audit log: one row per operator action, from the admin or the API.

    It also carries the permissions of the actions, one per action, so that a role can be
    allowed to retry but not to discard or replay.
    """

    class Action(models.TextChoices):
        OUTBOX_RETRY = "outbox.retry", "Retry outbox events"
        OUTBOX_DISCARD = "outbox.discard", "Discard outbox events"
        OUTBOX_REPLAY = "outbox.replay", "Replay outbox events (same event id)"
        OUTBOX_REPLAY_NEW_ID = "outbox.replay_new_id", "Replay outbox events (new event id)"
        OUTBOX_KEY_RELEASE = "outbox.release_key", "Release a quarantined key"
        INBOX_RETRY = "inbox.retry", "Retry inbox messages"
        INBOX_REPLAY = "inbox.replay", "Replay inbox messages"
        INBOX_DISCARD = "inbox.discard", "Discard inbox messages"

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
        db_table = "outbox_operator_action"
        ordering = ("-created_at",)
        default_permissions = ("view",)
        permissions = (
            ("retry_outboxevent", "Can retry outbox events"),
            ("discard_outboxevent", "Can discard outbox events"),
            ("replay_outboxevent", "Can replay outbox events"),
            ("release_outboxkey", "Can release quarantined outbox keys"),
            ("retry_inboxmessage", "Can retry inbox messages"),
            ("replay_inboxmessage", "Can replay inbox messages"),
            ("discard_inboxmessage", "Can discard inbox messages"),
        )

    def __str__(self) -> str:
        return (
            f"{self.username} {self.action} x{self.requested} at {self.created_at:%Y-%m-%d %H:%M}"
        )
