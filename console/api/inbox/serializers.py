from rest_framework import serializers

from console.api.serializers import (
    ActionInputSerializer,
    BulkInputSerializer,
    PayloadPrivacyMixin,
)
from inbox.models import InboxMessage

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
