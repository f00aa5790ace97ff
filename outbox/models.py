from typing import Any

from django.contrib.postgres.indexes import BrinIndex
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from kafka_events.errors import error_class_of
from outbox.ids import new_event_id

# Allocated by PostgreSQL at insert; orders the events of one key (see OutboxEvent.position).
POSITION_SEQUENCE = "outbox_event_position_seq"


class TransactionIdField(models.BigIntegerField):
    """A PostgreSQL transaction id (xid8), read as an int. PostgreSQL compares an xid8 with
    another xid8 only, so a value goes to the database as text, which it reads as one."""

    description = "PostgreSQL transaction id"

    def db_type(self, connection: Any) -> str:
        return "xid8"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> int | None:
        return None if value is None else int(value)

    def get_prep_value(self, value: Any) -> Any:
        return None if value is None else str(int(value))

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        # As the text get_prep_value makes: IntegerField's would send it as an int8 again.
        return value if prepared else self.get_prep_value(value)


class OutboxEventPermission(models.TextChoices):
    """Every permission on outbox events, declared once; code names them by member
    (`user.has_perm(OutboxEventPermission.RETRY)`). Each guards one operator action, so a role can
    retry but not discard or replay; the view permission is Django's default."""

    RETRY = "outbox.retry_outboxevent", "Can retry outbox events"
    DISCARD = "outbox.discard_outboxevent", "Can discard outbox events"
    REPLAY = "outbox.replay_outboxevent", "Can replay outbox events"
    RELEASE_KEY = "outbox.release_outboxkey", "Can release quarantined outbox keys"


class OutboxEvent(models.Model):
    """An event recorded in the business transaction: written once, never updated. Whether it
    went out, where to and how each try ended are its OutboxDelivery records; while its key is
    held back, an OutboxHeldEvent.

    The columns of id, aggregate type, aggregate id, event type and payload carry the names
    Debezium's Outbox Event Router reads, so a deployment can swap the relay for CDC.
    """

    class Status(models.TextChoices):
        """An event's delivery as users see it (outbox.selectors.outbox_events_with_delivery)."""

        PENDING = "PENDING", "Pending"
        DONE = "DONE", "Done"
        FAILED = "FAILED", "Failed"

    id = models.UUIDField(primary_key=True, default=new_event_id, editable=False, db_column="id")
    aggregate_type = models.CharField(max_length=255, db_column="aggregatetype")
    aggregate_id = models.CharField(max_length=255, db_column="aggregateid")
    event_type = models.CharField(max_length=255, db_column="type")
    payload = models.JSONField(encoder=DjangoJSONEncoder, db_column="payload")
    headers = models.JSONField(default=dict, blank=True)
    topic = models.CharField(max_length=249)
    key = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now)
    # Write order from a database sequence, drawn at insert: the relay sends the events that
    # became visible between two of its ticks in this order, whatever the order of their
    # transaction ids or the clocks of the writing processes (docs/outbox.md, Order per key).
    position = models.BigIntegerField(
        db_default=models.Func(models.Value(POSITION_SEQUENCE), function="nextval"),
        editable=False,
    )
    # The id of the transaction that wrote the event: the relay finds the events whose
    # transactions became visible between two ticks by it. Events written before the
    # event-log relay carry 0.
    transaction_id = TransactionIdField(
        db_column="txid", db_default=models.Func(function="pg_current_xact_id"), editable=False
    )

    class Meta:
        db_table = "outbox_event"
        # Newest first, by the relay's own index: the table has no B-tree on created_at.
        ordering = ("-transaction_id", "-position")
        permissions = tuple(
            (permission.value.partition(".")[2], permission.label)
            for permission in OutboxEventPermission
        )
        # The table is partitioned by day on created_at (migration 0014, made in SQL;
        # outbox.services.partitions), so `id` is not unique in the database: PostgreSQL's
        # unique indexes on a partitioned table must include created_at (a caller's own ids
        # are kept unique by OutboxGivenEventId).
        # Every B-tree index adds a WAL record to each publish(), inside the business
        # transaction (a leaf insert: 64 to 72 bytes in pg_walinspect for bench-outbox's
        # events), and some of its time. So there are two: the relay's read order (which also
        # orders the console's lists, newest first, and finds a held event) and the key, the
        # console's search for what happened to one aggregate (the key is its id unless the
        # publisher chose another). The id and created_at use BRIN indexes: the rows are
        # appended in about created_at order and the ids publish() draws are time-ordered
        # (outbox.ids), so a range of 128 pages has a narrow range of each; an insert into a
        # range of pages that has no summary yet (the range being filled, as a rule) writes
        # nothing to them, one into a range that has a summary a WAL record (72 bytes). The
        # id's is minmax-multi: a caller's own ids (random ones, version 4) are kept in its
        # summaries as points (up to 32 values a range, then they widen it), instead of
        # widening a range to match everything at once. The aggregate type and id, the event
        # type and the topic (the console's filters) share a BRIN index of bloom filters: a
        # range's summary says which values may be in it, so a value that matches nothing, or
        # few events, reads the summaries and the few ranges that may hold it, not the table;
        # a common value is found by reading the newest events first. Like the others, it
        # writes nothing on an insert into the range being filled.
        indexes = (
            models.Index(fields=("transaction_id", "position"), name="outbox_event_txid_idx"),
            models.Index(fields=("key",), name="outbox_event_key_idx"),
            # A range of 8 pages: a look-up of one event by its creation time (an id and the
            # time it carries, outbox.selectors._EVENT_PLACES_OF_IDS_SQL) rechecks a few
            # hundred rows, not the thousands of 128 pages.
            BrinIndex(
                fields=("created_at",),
                name="outbox_event_created_brin",
                autosummarize=True,
                pages_per_range=8,
            ),
            BrinIndex(
                fields=("id",),
                name="outbox_event_id_brin",
                autosummarize=True,
                opclasses=("uuid_minmax_multi_ops",),
            ),
            BrinIndex(
                fields=("aggregate_type", "aggregate_id", "event_type", "topic"),
                name="outbox_event_filter_bloom",
                autosummarize=True,
                # An aggregate id is about one per event: its filter is sized for as many
                # values as a range has rows (the default sizes for a tenth). The four
                # filters of a range share one index tuple, which must fit a page: a range of
                # 16 pages keeps them small with events of any size.
                pages_per_range=16,
                opclasses=(
                    "text_bloom_ops",
                    "text_bloom_ops(n_distinct_per_range = -1)",
                    "text_bloom_ops",
                    "text_bloom_ops",
                ),
            ),
        )

    def __str__(self) -> str:
        return f"{self.event_type} {self.id}"


class OutboxGivenEventId(models.Model):
    """An event id a caller chose (publish(event_id=...)), and the ids of the events from before
    partitioning (migration 0015). The event table is partitioned by day and can hold no unique
    index on the id alone, so this table keeps a given id from being used twice; ids publish()
    draws itself are new and time-ordered, and need none. Retention deletes an id once its
    event is gone."""

    id = models.UUIDField(primary_key=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "outbox_event_given_id"

    def __str__(self) -> str:
        return str(self.id)


class OutboxDelivery(models.Model):
    """One attempt of the event-log relay to send one event: written once, never updated.

    The event row itself is never touched after publish(); whether an event went out, where
    to and how each try ended are these rows. No foreign key: the event table and this one
    are emptied on their own schedules. Partitioned by day on published_at like the events
    (migration 0014), with no index on `id`, which nothing looks up."""

    class Outcome(models.TextChoices):
        PUBLISHED = "PUBLISHED", "Published"
        # The broker refused the record or did not confirm it in time; the key is held.
        FAILED = "FAILED", "Failed"
        # An operator gave up on the event: its key's later events flow on. A replay sends it
        # again.
        DISCARDED = "DISCARDED", "Discarded"

    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField()
    outcome = models.CharField(max_length=9, choices=Outcome.choices)
    # When the broker confirmed the record (for a failure, when the report came; for a
    # discard, when the operator gave up).
    published_at = models.DateTimeField()
    kafka_partition = models.IntegerField(null=True, blank=True)
    kafka_offset = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    relay = models.CharField(max_length=255)
    # How long the try took: from the relay handing the record to the producer to its delivery
    # report (or refusal, or the relay giving up on a report), in whole milliseconds. NULL for
    # a discard (no try) and for the records written before migration 0018. Whole milliseconds
    # in an integer, not the inbox attempts' float8: every record the relay writes carries it,
    # and 4 bytes add at most one 8-byte step to a record's WAL (often none: they fit in the
    # alignment padding), where 8 bytes aligned to 8 add up to two. The error's class is not
    # stored: it is read from `error` (the text before ':' on its first line, as the console's
    # failure groups read it), which costs a published record nothing.
    duration_ms = models.IntegerField(null=True, blank=True)
    # A discard's event row: its place (its creation time, the partition key, and its
    # transaction id and position, the relay's index), as the held row it replaces kept it, so
    # that the console finds the discarded events without looking each one up by id (the event
    # table has no B-tree on the id). NULL for every other record (a NULL adds no byte to a
    # record that already has NULL columns) and for the discards recorded before migration
    # 0019, which the console looks up by the time their id carries.
    event_created_at = models.DateTimeField(null=True, blank=True)
    event_transaction_id = models.BigIntegerField(null=True, blank=True)
    event_position = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "outbox_delivery"
        indexes = (
            models.Index(fields=("event_id",), name="outbox_delivery_event_idx"),
            # The events an operator discarded (FAILED, the console's status filter): a few
            # records among millions, found without reading the others. Partial, so no other
            # record adds an entry (or WAL) to it.
            models.Index(
                fields=("event_id",),
                name="outbox_delivery_discarded_idx",
                condition=models.Q(outcome="DISCARDED"),
            ),
            # The console's filter by error class: the failed tries of one class, and when the
            # latest was (the newest event it can concern). Partial: a published record, the
            # rule, adds no entry.
            models.Index(
                error_class_of("error"),
                "published_at",
                name="outbox_delivery_errclass_idx",
                condition=models.Q(outcome="FAILED"),
            ),
            # The console's publish rates read the records of the last hour or day by
            # published_at. The records are appended in about that order, so a BRIN index (one
            # summary per 128 pages, 24 kB for 200,000 records) finds them. A B-tree would add
            # a WAL record to every delivery record written (measured: about 55 bytes, a fifth
            # more WAL per record), against the relay's WAL-per-event target; this adds none
            # while the range being filled has no summary yet (autosummarize summarizes it once
            # the next one starts), and a WAL record in a range that has one.
            BrinIndex(
                fields=("published_at",),
                name="outbox_delivery_published_brin",
                autosummarize=True,
            ),
        )

    def __str__(self) -> str:
        return f"{self.event_id} {self.outcome}"


class OutboxHeldEvent(models.Model):
    """An event the event-log relay holds back: the head of its key, which failed, or one
    queued behind that head. The relay sends the head again when its retry comes due, then
    the rest of the key in order; other keys are never held up. Rows exist only for keys
    with a failure, so the table stays small."""

    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(unique=True)
    shard = models.SmallIntegerField()
    topic = models.CharField(max_length=249)
    key = models.CharField(max_length=255)
    # The event's place: its transaction id (whether it committed before a tick) and its
    # position (its place in its key's order).
    transaction_id = models.BigIntegerField()
    position = models.BigIntegerField()
    # Where the event's row is: its own transaction id and position, which the event table's
    # index of commit order finds (the table has no B-tree on the id). The same as the place
    # above, but for an event replayed with its own id: held again as the last of its key.
    event_transaction_id = models.BigIntegerField()
    event_position = models.BigIntegerField()
    # The event's created_at, the event table's partition key: a read of the row probes the
    # partition of its day only (HELD_EVENT_ROW_JOIN), not every day's.
    event_created_at = models.DateTimeField()
    # Meaningful on the head only: its failed attempts, and when it is tried again (NULL
    # once its attempts are spent: an operator retries or discards it).
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    held_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "outbox_held_event"
        indexes = (
            models.Index(
                fields=("shard", "topic", "key", "transaction_id", "position"),
                name="outbox_held_key_order_idx",
            ),
        )

    def __str__(self) -> str:
        return f"{self.event_id} held on {self.topic}/{self.key}"
