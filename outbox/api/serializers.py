from rest_framework import serializers

from inbox.models import InboxMessage
from outbox.models import OutboxEvent

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


class OutboxEventDetailSerializer(serializers.ModelSerializer):
    payload = serializers.JSONField(read_only=True)
    headers = serializers.JSONField(read_only=True)
    # The event's timeline: its inbox rows in every consumer group.
    consumers = serializers.SerializerMethodField()

    class Meta:
        model = OutboxEvent
        fields = (*LIST_FIELDS, "payload", "headers", "position", "updated_at", "consumers")
        read_only_fields = fields

    def get_consumers(self, event: OutboxEvent) -> list[dict]:
        rows = (
            InboxMessage.objects.filter(event_id=str(event.pk))
            .defer("payload", "headers", "raw_value")
            .order_by("received_at")
        )
        return list(InboxTimelineSerializer(rows, many=True).data)


class ActionInputSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class ReplayInputSerializer(ActionInputSerializer):
    new_event_id = serializers.BooleanField(
        default=False,
        help_text="false: the same event id (consumers count a duplicate); true: a new event "
        "id (consumers process it again; header replay_of names the original).",
    )


class BulkInputSerializer(ActionInputSerializer):
    ids = serializers.ListField(child=serializers.UUIDField(), required=False, min_length=1)
    filter = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        help_text='The list endpoint\'s filters, e.g. {"status": "FAILED"}.',
    )
    dry_run = serializers.BooleanField(default=False)

    def validate(self, attrs: dict) -> dict:
        from django.conf import settings

        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError("Give either 'ids' or 'filter', not both or none.")
        if len(attrs.get("ids", ())) > settings.API_BULK_MAX_IDS:
            raise serializers.ValidationError(
                f"At most {settings.API_BULK_MAX_IDS} ids per request; select by filter instead."
            )
        return attrs


class BulkReplayInputSerializer(BulkInputSerializer, ReplayInputSerializer):
    pass


class BulkResultSerializer(serializers.Serializer):
    action = serializers.CharField(read_only=True)
    dry_run = serializers.BooleanField(read_only=True)
    matched = serializers.IntegerField(read_only=True)
    changed = serializers.IntegerField(read_only=True, allow_null=True)
    queued_chunks = serializers.IntegerField(read_only=True)
    audit_id = serializers.IntegerField(read_only=True, allow_null=True)


class KeyReleaseInputSerializer(ActionInputSerializer):
    topic = serializers.CharField(max_length=249)
    key = serializers.CharField(max_length=255)


class KeyReleaseResultSerializer(serializers.Serializer):
    changed = serializers.IntegerField(read_only=True)
    audit_id = serializers.IntegerField(read_only=True)
