from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.utils import timezone

from kafka_events.errors import error_class_of

# The rows that hold their key in a group with order per key (inbox.services.sequences): not
# done, not discarded, not released, with a key. The condition of inbox_message_holding_idx,
# which serves every query on them; sequences.HOLDING_SQL says the same in SQL.
HOLDING = ~Q(status="DONE") & Q(
    discarded_at__isnull=True, released_at__isnull=True, key__isnull=False
)


class InboxMessagePermission(models.TextChoices):
    """Every permission on inbox messages, declared once; code names them by member
    (`user.has_perm(InboxMessagePermission.RETRY)`). Each guards one operator action; the view
    permission is Django's default."""

    RETRY = "inbox.retry_inboxmessage", "Can retry inbox messages"
    REPLAY = "inbox.replay_inboxmessage", "Can replay inbox messages"
    DISCARD = "inbox.discard_inboxmessage", "Can discard inbox messages"
    # Order per key (inbox.services.sequences): the actions on a held key.
    RETRY_SEQUENCE = "inbox.retry_inboxsequence", "Can retry the sequence of a held key"
    SKIP_HEAD = "inbox.skip_inboxsequencehead", "Can skip the head of a held key"
    RELEASE_KEY = "inbox.release_inboxkey", "Can release a held key"


class InboxMessage(models.Model):
    """One event as a consumer group received it: the dedup record and the retry queue.

    Unique per (consumer_group, event_id), so a redelivery is counted, never applied again.
    """

    class Status(models.TextChoices):
        PENDING = "PENDING", "Pending"
        DONE = "DONE", "Done"
        FAILED = "FAILED", "Failed"
        # Recorded behind an earlier row of its key that is not done (ordering "key"): its
        # handler runs after that row's (inbox.services.sequences).
        PARKED = "PARKED", "Parked"

    event_id = models.CharField(max_length=255)
    consumer_group = models.CharField(max_length=255)
    topic = models.CharField(max_length=249)
    partition = models.IntegerField()
    offset = models.BigIntegerField()
    # Kafka tells a null key from an empty one, and so does this column.
    key = models.TextField(null=True, blank=True)  # noqa: DJ001
    event_type = models.CharField(max_length=255, blank=True, default="")
    aggregate_type = models.CharField(max_length=255, blank=True, default="")
    aggregate_id = models.CharField(max_length=255, blank=True, default="")
    # Null for a record whose value is not JSON; raw_value keeps its bytes then.
    payload = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    raw_value = models.TextField(blank=True, default="")
    raw_value_encoding = models.CharField(max_length=8, blank=True, default="")
    status = models.CharField(max_length=7, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    published_at = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    processed_at = models.DateTimeField(null=True, blank=True)
    duplicate_count = models.PositiveIntegerField(default=0)
    last_duplicate_at = models.DateTimeField(null=True, blank=True)
    # Set when an operator discards a FAILED row: it is kept (for audit, and so that a
    # redelivery is still recognised as a duplicate) but no longer counts as a failure to
    # act on. A replay clears it.
    discarded_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Set when an operator releases the key this row holds (ordering "key"): the row keeps its
    # state and the rows behind it run on. Poison rows are recorded released: no handler can
    # ever run them, so they never hold their key.
    released_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "inbox_message"
        ordering = ("-received_at",)
        permissions = tuple(
            (permission.value.partition(".")[2], permission.label)
            for permission in InboxMessagePermission
        )
        constraints = (
            models.UniqueConstraint(
                fields=("consumer_group", "event_id"), name="inbox_message_group_event_uniq"
            ),
        )
        indexes = (
            # Beat's retry scan: PENDING rows that are due.
            models.Index(
                fields=("next_attempt_at",),
                name="inbox_message_retry_idx",
                condition=Q(status="PENDING"),
            ),
            models.Index(fields=("status", "received_at"), name="inbox_message_status_idx"),
            models.Index(fields=("received_at",), name="inbox_message_received_idx"),
            models.Index(fields=("processed_at",), name="inbox_message_processed_idx"),
            # An outbox event's timeline: its inbox rows in every group.
            models.Index(fields=("event_id",), name="inbox_message_event_idx"),
            models.Index(fields=("event_type",), name="inbox_message_type_idx"),
            models.Index(fields=("topic", "partition", "offset"), name="inbox_message_tpo_idx"),
            # The console's search by aggregate id or key (an event id has its own index).
            models.Index(fields=("aggregate_id",), name="inbox_message_aggregate_idx"),
            models.Index(fields=("key",), name="inbox_message_key_idx"),
            # The console's filters by aggregate type, by discard and by error class: without
            # them, each filter that matches few rows reads the whole table. The last two hold
            # only the rows an operator discarded or whose handler failed.
            models.Index(fields=("aggregate_type",), name="inbox_message_aggtype_idx"),
            models.Index(
                fields=("discarded_at",),
                name="inbox_message_discarded_idx",
                condition=Q(discarded_at__isnull=False),
            ),
            models.Index(
                error_class_of("last_error"),
                name="inbox_message_error_class_idx",
                condition=~Q(last_error=""),
            ),
            # The rows that hold their key (inbox.services.sequences.HOLDING), in order: a
            # batch's look-up of its held keys, a sequence's run, the retry task's scan. Rows
            # that are done, the vast majority, are not in it.
            models.Index(
                fields=("consumer_group", "topic", "key", "partition", "offset"),
                name="inbox_message_holding_idx",
                condition=HOLDING,
            ),
        )

    def __str__(self) -> str:
        return f"{self.event_type or '?'} {self.event_id} in {self.consumer_group} ({self.status})"


class ConsumerOffset(models.Model):
    """The next offset to read, stored in the transaction of the effects (exactly-once mode)."""

    consumer_group = models.CharField(max_length=255)
    topic = models.CharField(max_length=249)
    partition = models.IntegerField()
    next_offset = models.BigIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "inbox_consumer_offset"
        constraints = (
            models.UniqueConstraint(
                fields=("consumer_group", "topic", "partition"),
                name="inbox_consumer_offset_uniq",
            ),
        )

    def __str__(self) -> str:
        return f"{self.consumer_group} {self.topic}[{self.partition}] @ {self.next_offset}"


class InboxAttempt(models.Model):
    """One run of a message's handler: written once, in the transaction that records the
    run's outcome on the message, never updated.

    Written by the consumer (the batch's runs, in one statement) and by the retry task, which
    also writes a FAILED attempt with no handler when it finds none for the message; a message
    that no handler ran (a duplicate, a poison record, one parked or deferred) has none. No
    foreign key, as for the outbox's delivery records: the consumer writes a batch's messages
    and attempts without a check per row, and the retention deletes a message's attempts with
    it (inbox.services.retention). Messages recorded before this table existed have an
    attempt count and no rows."""

    class Outcome(models.TextChoices):
        # The handler returned: its effects committed with the message's DONE.
        DONE = "DONE", "Done"
        # The handler raised: its effects were rolled back; the message is retried later, or
        # is FAILED once its attempts are spent.
        FAILED = "FAILED", "Failed"

    id = models.BigAutoField(primary_key=True)
    message_id = models.BigIntegerField()
    # When the handler started, and how long it ran (its savepoint included).
    attempted_at = models.DateTimeField()
    duration_ms = models.FloatField()
    outcome = models.CharField(max_length=6, choices=Outcome.choices)
    # The exception's module and qualified name, and the text last_error keeps (its message
    # and the last frames of its traceback); empty for DONE.
    error_class = models.CharField(max_length=255, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # Who ran it: the consumer's group member id (else its client.id) and its host and
    # process, or the retry task's host and process.
    member = models.CharField(max_length=255)
    # The record it ran: the delivery the consumer read, or the stored copy of the message
    # (its first delivery) for a run of the retry task.
    partition = models.IntegerField()
    offset = models.BigIntegerField()
    handler = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        db_table = "inbox_attempt"
        indexes = (
            # A message's attempts, in order; the retention's delete of them.
            models.Index(fields=("message_id", "id"), name="inbox_attempt_message_idx"),
        )

    def __str__(self) -> str:
        return f"message {self.message_id} {self.outcome} at {self.attempted_at}"
