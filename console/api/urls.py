from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console.api.stats import ConsumerLagView, StatsSummaryView

urlpatterns = [
    path("outbox/", include("console.api.outbox.urls")),
    path("inbox/", include("console.api.inbox.urls")),
    path("analytics/", include("console.api.analytics.urls")),
    path("stats/summary/", StatsSummaryView.as_view(), name="stats-summary"),
    path("stats/consumer-lag/", ConsumerLagView.as_view(), name="stats-consumer-lag"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
