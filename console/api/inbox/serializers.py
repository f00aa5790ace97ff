from rest_framework import serializers

from console.api.serializers import (
    ActionInputSerializer,
    BulkInputSerializer,
    PayloadPrivacyMixin,
)
from inbox.models import InboxAttempt, InboxMessage

LIST_FIELDS = (
    "id",
    "event_id",
    "consumer_group",
    "topic",
    "partition",
    "offset",
    "key",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "status",
    "attempts",
    "next_attempt_at",
    "last_error",
    "published_at",
    "received_at",
    "processed_at",
    "duplicate_count",
    "last_duplicate_at",
    "discarded_at",
    "released_at",
)


class InboxMessageListSerializer(serializers.ModelSerializer):
    class Meta:
        model = InboxMessage
        fields = LIST_FIELDS
        read_only_fields = LIST_FIELDS


class InboxMessageDetailSerializer(PayloadPrivacyMixin, serializers.ModelSerializer):
    # Null without console.view_payload (console/privacy.py).
    payload = serializers.JSONField(read_only=True, allow_null=True)
    headers = serializers.JSONField(read_only=True, allow_null=True)
    raw_value = serializers.CharField(read_only=True, allow_null=True)
    raw_value_encoding = serializers.CharField(read_only=True, allow_null=True)

    class Meta:
        model = InboxMessage
        fields = (*LIST_FIELDS, "payload", "headers", "raw_value", "raw_value_encoding")
        read_only_fields = fields


class InboxAttemptSerializer(serializers.ModelSerializer):
    """One run of a message's handler, as the consumer or the retry task recorded it."""

    attempted_at = serializers.DateTimeField(read_only=True, help_text="When the handler started.")
    duration_ms = serializers.FloatField(
        read_only=True, help_text="How long the handler ran, in milliseconds."
    )
    error_class = serializers.CharField(
        read_only=True, help_text="The exception's module and class; empty for DONE."
    )
    error = serializers.CharField(
        read_only=True,
        help_text="The error as last_error keeps it (type, message, the last frames of the "
        "traceback); empty for DONE.",
    )
    member = serializers.CharField(
        read_only=True,
        help_text="Who ran it: the consumer's group member id (else its client.id) or "
        "retry-task, then @host:pid.",
    )
    partition = serializers.IntegerField(
        read_only=True,
        help_text="The record run: the delivery the consumer read, or the message's stored "
        "record for the retry task.",
    )
    offset = serializers.IntegerField(read_only=True)
    handler = serializers.CharField(
        read_only=True, help_text="The handler's module and name; empty when none was found."
    )

    class Meta:
        model = InboxAttempt
        fields = (
            "id",
            "attempted_at",
            "duration_ms",
            "outcome",
            "error_class",
            "error",
            "member",
            "partition",
            "offset",
            "handler",
        )
        read_only_fields = fields


class InboxBulkInputSerializer(BulkInputSerializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, min_length=1
    )


class HeldKeySerializer(serializers.Serializer):
    """A key held in a group with ordering "key": the head, and how many rows are parked."""

    consumer_group = serializers.CharField(read_only=True)
    topic = serializers.CharField(read_only=True)
    key = serializers.CharField(read_only=True)
    parked = serializers.IntegerField(read_only=True)
    head = InboxMessageListSerializer(read_only=True)


class HeldKeyQuerySerializer(serializers.Serializer):
    consumer_group = serializers.CharField(max_length=255, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=1000, default=100)


class HeldKeyActionInputSerializer(ActionInputSerializer):
    # As stored: a key's spaces are part of it.
    consumer_group = serializers.CharField(max_length=255, trim_whitespace=False)
    topic = serializers.CharField(max_length=249, trim_whitespace=False)
    key = serializers.CharField(trim_whitespace=False)


class HeldKeyActionResultSerializer(serializers.Serializer):
    head = InboxMessageListSerializer(read_only=True)
    audit_id = serializers.IntegerField(read_only=True)
