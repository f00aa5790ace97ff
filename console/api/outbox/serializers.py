from rest_framework import serializers

from console.api.serializers import (
    ActionInputSerializer,
    BulkInputSerializer,
    PayloadPrivacyMixin,
)
from console.selectors import event_consumers
from inbox.models import InboxMessage
from outbox.models import OutboxDelivery, OutboxEvent

LIST_FIELDS = (
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "topic",
    "key",
    "status",
    "attempts",
    "next_attempt_at",
    "last_error",
    "created_at",
    "published_at",
    "kafka_partition",
    "kafka_offset",
    "discarded_at",
)


class OutboxEventListSerializer(serializers.ModelSerializer):
    """An event with its delivery as users see it."""

    # The delivery fields keep the names of the event row's columns they replaced but read
    # the annotations of outbox.selectors.outbox_events_with_delivery, which the instance must
    # carry.

    status = serializers.ChoiceField(
        source="delivery_status", choices=OutboxEvent.Status.choices, read_only=True
    )
    attempts = serializers.IntegerField(
        source="delivery_attempts",
        read_only=True,
        help_text="Tries that ended in a delivery report.",
    )
    last_error = serializers.CharField(
        source="delivery_error", read_only=True, help_text="The error of the last failed try."
    )
    published_at = serializers.DateTimeField(
        source="delivered_at",
        read_only=True,
        allow_null=True,
        help_text="When the broker confirmed the latest publication.",
    )
    kafka_partition = serializers.IntegerField(
        source="delivered_partition", read_only=True, allow_null=True
    )
    kafka_offset = serializers.IntegerField(
        source="delivered_offset", read_only=True, allow_null=True
    )
    discarded_at = serializers.DateTimeField(
        source="delivery_discarded_at", read_only=True, allow_null=True
    )
    next_attempt_at = serializers.DateTimeField(
        source="delivery_next_attempt_at",
        read_only=True,
        allow_null=True,
        help_text="When the relay tries a held event next (after a failure, or a retry by an "
        "operator); null once its attempts are spent (an operator retries or discards it), and "
        "for an event not held: delivered, discarded, or sent by the relay in its turn.",
    )

    class Meta:
        model = OutboxEvent
        fields = LIST_FIELDS
        read_only_fields = LIST_FIELDS


class InboxTimelineSerializer(serializers.ModelSerializer):
    class Meta:
        model = InboxMessage
        fields = (
            "id",
            "consumer_group",
            "status",
            "attempts",
            "partition",
            "offset",
            "received_at",
            "processed_at",
            "duplicate_count",
            "last_error",
        )
        read_only_fields = fields


class OutboxEventDetailSerializer(PayloadPrivacyMixin, OutboxEventListSerializer):
    # Null without console.view_payload (console/privacy.py).
    payload = serializers.JSONField(read_only=True, allow_null=True)
    headers = serializers.JSONField(read_only=True, allow_null=True)
    # The event's timeline: its inbox rows in every consumer group.
    consumers = serializers.SerializerMethodField()

    class Meta:
        model = OutboxEvent
        fields = (*LIST_FIELDS, "payload", "headers", "position", "consumers")
        read_only_fields = fields

    def get_consumers(self, event: OutboxEvent) -> list[dict]:
        return list(InboxTimelineSerializer(event_consumers(event_id=event.pk), many=True).data)


class OutboxDeliverySerializer(serializers.ModelSerializer):
    """One attempt to deliver an event, as the relay (or an operator's discard) recorded it."""

    at = serializers.DateTimeField(
        source="published_at",
        read_only=True,
        help_text="When the broker confirmed the record; for a failure, when the report came; "
        "for a discard, when the operator gave up.",
    )
    duration_ms = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="How long the try took, in whole milliseconds: from the relay handing the "
        "record to the producer to its delivery report (or its refusal, or the relay giving up "
        "on a report). Null for a discard, for a record the producer never took (the rest of "
        "a batch after a fatal producer error) and for records written before durations were "
        "kept.",
    )
    # Read from the error text by console.selectors.outbox_event_attempts, which the
    # instances must come from.
    error_class = serializers.CharField(
        read_only=True,
        help_text="The error's class, the text before ':' on its first line (a librdkafka "
        "error name such as MSG_SIZE_TOO_LARGE or _MSG_TIMED_OUT, or RECORD_TOO_LARGE for a "
        "record over its topic's limit); empty for PUBLISHED and DISCARDED.",
    )

    class Meta:
        model = OutboxDelivery
        fields = (
            "id",
            "outcome",
            "at",
            "duration_ms",
            "kafka_partition",
            "kafka_offset",
            "error_class",
            "error",
            "relay",
        )
        read_only_fields = fields


class ReplayInputSerializer(ActionInputSerializer):
    new_event_id = serializers.BooleanField(
        default=False,
        help_text="false: the same event id (consumers count a duplicate); true: a new event "
        "id (consumers process it again; header replay_of names the original).",
    )


class OutboxBulkInputSerializer(BulkInputSerializer):
    ids = serializers.ListField(child=serializers.UUIDField(), required=False, min_length=1)


class BulkReplayInputSerializer(OutboxBulkInputSerializer, ReplayInputSerializer):
    pass


class KeyReleaseInputSerializer(ActionInputSerializer):
    topic = serializers.CharField(max_length=249)
    key = serializers.CharField(max_length=255)


class KeyReleaseResultSerializer(serializers.Serializer):
    changed = serializers.IntegerField(read_only=True)
    audit_id = serializers.IntegerField(read_only=True)
