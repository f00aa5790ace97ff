from rest_framework import serializers

from console.api.serializers import BulkInputSerializer
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
)


class InboxMessageListSerializer(serializers.ModelSerializer):
    class Meta:
        model = InboxMessage
        fields = LIST_FIELDS
        read_only_fields = LIST_FIELDS


class InboxMessageDetailSerializer(serializers.ModelSerializer):
    payload = serializers.JSONField(read_only=True)
    headers = serializers.JSONField(read_only=True)

    class Meta:
        model = InboxMessage
        fields = (*LIST_FIELDS, "payload", "headers", "raw_value", "raw_value_encoding")
        read_only_fields = fields


class InboxBulkInputSerializer(BulkInputSerializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, min_length=1
    )
