from csp.decorators import csp_update
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import SimpleRouter

from console.api.bulk_operations import BulkOperationViewSet
from console.api.stats import ConsumerLagView, StatsSummaryView

bulk_operations = SimpleRouter()
bulk_operations.register("bulk-operations", BulkOperationViewSet, basename="bulk-operation")

# Swagger UI, with its start-up script served from a URL (docs/?script) rather than inline: the
# Content-Security-Policy runs no inline script without the response's nonce. Swagger UI
# draws its icons from data: images, which this page alone allows.
api_docs_view = csp_update({"img-src": ["data:"]})(
    SpectacularSwaggerSplitView.as_view(url_name="api-schema")
)

urlpatterns = [
    path("outbox/", include("console.api.outbox.urls")),
    path("inbox/", include("console.api.inbox.urls")),
    path("analytics/", include("console.api.analytics.urls")),
    *bulk_operations.urls,
    path("stats/summary/", StatsSummaryView.as_view(), name="stats-summary"),
    path("stats/consumer-lag/", ConsumerLagView.as_view(), name="stats-consumer-lag"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", api_docs_view, name="api-docs"),
]
