from rest_framework import serializers

from console.api.serializers import ActionInputSerializer, BulkInputSerializer
from console.selectors import event_consumers
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
        return list(InboxTimelineSerializer(event_consumers(event_id=event.pk), many=True).data)


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
