from typing import Any

from rest_framework import serializers

from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from console.api.fields import DateTimeField


class AnalyticsRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = AnalyticsRun
        fields = (
            "id",
            "status",
            "trigger",
            "window_start",
            "window_end",
            "spark_master",
            "started_at",
            "finished_at",
            "duration_seconds",
            "rows_read",
            "outbox_rows",
            "inbox_rows",
            "kafka_records",
            "findings",
            "summary",
            "error",
            "worker",
            "heartbeat_at",
        )
        read_only_fields = fields


class DeliveryLagStatSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeliveryLagStat
        fields = (
            "id",
            "run",
            "hour",
            "topic",
            "event_type",
            "consumer_group",
            "stage",
            "count",
            "p50",
            "p95",
            "p99",
            "max",
        )
        read_only_fields = fields


class DuplicateStatSerializer(serializers.ModelSerializer):
    class Meta:
        model = DuplicateStat
        fields = (
            "id",
            "run",
            "hour",
            "topic",
            "consumer_group",
            "deliveries",
            "unique_events",
            "duplicate_deliveries",
            "duplicate_rate",
            "max_copies",
        )
        read_only_fields = fields


class RelayStatSerializer(serializers.ModelSerializer):
    class Meta:
        model = RelayStat
        fields = (
            "id",
            "run",
            "hour",
            "topic",
            "events",
            "published",
            "pending",
            "failed",
            "retried",
            "retry_rate",
            "failure_rate",
            "max_attempts",
        )
        read_only_fields = fields


class ReconciliationFindingSerializer(serializers.ModelSerializer):
    kafka_offsets = serializers.ListField(child=serializers.IntegerField(), read_only=True)

    class Meta:
        model = ReconciliationFinding
        fields = (
            "id",
            "run",
            "kind",
            "event_id",
            "topic",
            "event_type",
            "consumer_group",
            "created_at",
            "published_at",
            "kafka_partition",
            "kafka_offsets",
            "detail",
        )
        read_only_fields = fields


class RunStartInputSerializer(serializers.Serializer):
    since = DateTimeField(
        required=False,
        help_text="Window start, ISO 8601 with a time zone; with `until`, or neither for the "
        "last window the consume SLA has closed.",
    )
    until = DateTimeField(required=False, help_text="Window end (exclusive).")
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if (since is None) != (until is None):
            raise serializers.ValidationError(
                "Give both since and until, or neither for the last closed window."
            )
        if since is not None and until is not None and since >= until:
            raise serializers.ValidationError(
                f"since ({since.isoformat()}) must be before until ({until.isoformat()})."
            )
        return attrs


class RunStartResultSerializer(serializers.Serializer):
    queued = serializers.BooleanField(read_only=True)
    window_start = serializers.DateTimeField(read_only=True)
    window_end = serializers.DateTimeField(read_only=True)
    audit_id = serializers.IntegerField(read_only=True)
