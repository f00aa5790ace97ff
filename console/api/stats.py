"""Stats of the console: /api/stats/summary/ and /api/stats/consumer-lag/."""

from datetime import timedelta
from typing import Any

from django.db.models import Model
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.defaults import page_not_found
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.exceptions import error_body
from console.api.middleware import is_api_path
from console.api.permissions import view_permission
from console.consumer_lag import consumer_lag
from console.selectors import console_summary, latest_analytics, rate_series
from inbox.models import InboxMessage
from outbox.models import OutboxEvent

VIEW_BOTH = [view_permission(OutboxEvent), view_permission(InboxMessage)]

# The bodies of the two views, declared so that the schema states every field (the views
# answer what console.selectors and console.consumer_lag compute; the contract test holds
# each body to these).


def _status_counts_serializer(model: type[Model]) -> type[serializers.Serializer]:
    """Rows by status: one count per status of `model` (console.selectors.status_counts)."""
    statuses = model.Status.values  # type: ignore[attr-defined]
    fields = {status: serializers.IntegerField(read_only=True) for status in statuses}
    name = f"{model.__name__}StatusCountsSerializer"
    return type(name, (serializers.Serializer,), fields)


class OutboxSummarySerializer(serializers.Serializer):
    counts = _status_counts_serializer(OutboxEvent)(read_only=True)
    done_estimated = serializers.BooleanField(
        read_only=True, help_text="DONE is PostgreSQL's estimate of a big table, not a count."
    )
    oldest_pending_age_seconds = serializers.FloatField(
        read_only=True, allow_null=True, help_text="Null when nothing is pending."
    )


class DuplicatesLastHourSerializer(serializers.Serializer):
    messages = serializers.IntegerField(read_only=True)
    copies = serializers.IntegerField(read_only=True)


class InboxSummarySerializer(serializers.Serializer):
    counts = _status_counts_serializer(InboxMessage)(read_only=True)
    done_estimated = serializers.BooleanField(
        read_only=True, help_text="DONE is PostgreSQL's estimate of a big table, not a count."
    )
    duplicates_last_hour = DuplicatesLastHourSerializer(read_only=True)


class ErrorClassCountSerializer(serializers.Serializer):
    side = serializers.ChoiceField(choices=["outbox", "inbox"], read_only=True)
    error_class = serializers.CharField(read_only=True)
    count = serializers.IntegerField(read_only=True)


class RatesLastHourSerializer(serializers.Serializer):
    bucket_seconds = serializers.IntegerField(read_only=True)
    labels = serializers.ListField(child=serializers.CharField(), read_only=True)
    published = serializers.ListField(child=serializers.IntegerField(), read_only=True)
    consumed = serializers.ListField(child=serializers.IntegerField(), read_only=True)


class LatestAnalyticsSerializer(serializers.Serializer):
    window_start = serializers.DateTimeField(read_only=True)
    window_end = serializers.DateTimeField(read_only=True)
    window_age_seconds = serializers.FloatField(read_only=True)
    finished_at = serializers.DateTimeField(read_only=True, allow_null=True)
    summary = serializers.DictField(read_only=True)


class StatsSummarySerializer(serializers.Serializer):
    outbox = OutboxSummarySerializer(read_only=True)
    inbox = InboxSummarySerializer(read_only=True)
    failures_by_error_class = ErrorClassCountSerializer(many=True, read_only=True)
    rates_last_hour = RatesLastHourSerializer(read_only=True)
    analytics = LatestAnalyticsSerializer(
        read_only=True, allow_null=True, help_text="Null without analytics results."
    )


class PartitionLagSerializer(serializers.Serializer):
    group = serializers.CharField(read_only=True)
    topic = serializers.CharField(read_only=True)
    partition = serializers.IntegerField(read_only=True)
    committed = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="Null while the group has committed nothing."
    )
    high_watermark = serializers.IntegerField(read_only=True)
    lag = serializers.IntegerField(read_only=True)


class ConsumerLagSerializer(serializers.Serializer):
    reachable = serializers.BooleanField(read_only=True)
    error = serializers.CharField(read_only=True, help_text="Empty while Kafka answers.")
    partitions = PartitionLagSerializer(many=True, read_only=True)
    checked_at = serializers.DateTimeField(read_only=True)
    total_by_group = serializers.DictField(child=serializers.IntegerField(), read_only=True)


class StatsSummaryView(APIView):
    """Counts by status, the oldest pending event's age, publish and consume rates over the
    last hour, failures by error class, and the latest analytics results when present. The
    outbox's counts and the failures by error class are read at most once every
    CONSOLE_DASHBOARD_CACHE_SECONDS (10 s by default), as the dashboard shows them."""

    required_permissions = {"*": VIEW_BOTH}

    @extend_schema(responses=StatsSummarySerializer)
    def get(self, request: Request) -> Response:
        summary: dict[str, Any] = console_summary()
        hour = rate_series(period=timedelta(hours=1), bucket=timedelta(minutes=5))
        summary["rates_last_hour"] = {
            "bucket_seconds": 300,
            "labels": hour.labels,
            "published": hour.published,
            "consumed": hour.consumed,
        }
        summary["analytics"] = latest_analytics()
        return Response(summary)


class ConsumerLagView(APIView):
    """Committed offset against high watermark per consumer group, topic and partition, read
    from Kafka with a short timeout; `reachable` is false when Kafka does not answer."""

    required_permissions = {"*": [view_permission(InboxMessage)]}

    @extend_schema(responses=ConsumerLagSerializer)
    def get(self, request: Request) -> Response:
        return Response(consumer_lag().as_dict())


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 404 handler: under the API the API's JSON error, elsewhere Django's page."""
    if is_api_path(request.path):
        docs = reverse("api-docs")
        return JsonResponse(
            error_body("not_found", f"No API endpoint at {request.path}; {docs} lists them."),
            status=404,
        )
    return page_not_found(request, exception)
