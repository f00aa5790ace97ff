"""Stats of the console: /api/stats/summary/ and /api/stats/consumer-lag/."""

from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.defaults import page_not_found
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
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


class StatsSummaryView(APIView):
    """Counts by status, the oldest pending event's age, publish and consume rates over the
    last hour, failures by error class, and the latest analytics results when present."""

    required_permissions = {"*": VIEW_BOTH}

    @extend_schema(responses=OpenApiTypes.OBJECT)
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

    @extend_schema(responses=OpenApiTypes.OBJECT)
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
