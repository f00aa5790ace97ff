from django.conf import settings
from rest_framework import serializers

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


class InboxActionInputSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class InboxBulkInputSerializer(InboxActionInputSerializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, min_length=1
    )
    filter = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        help_text='The list endpoint\'s filters, e.g. {"status": "FAILED"}.',
    )
    dry_run = serializers.BooleanField(default=False)

    def validate(self, attrs: dict) -> dict:
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError("Give either 'ids' or 'filter', not both or none.")
        if len(attrs.get("ids", ())) > settings.API_BULK_MAX_IDS:
            raise serializers.ValidationError(
                f"At most {settings.API_BULK_MAX_IDS} ids per request; select by filter instead."
            )
        return attrs
