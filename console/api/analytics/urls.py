from rest_framework.routers import SimpleRouter

from console.api.analytics.views import (
    AnalyticsRunViewSet,
    DeliveryLagStatViewSet,
    DuplicateStatViewSet,
    ReconciliationFindingViewSet,
    RelayStatViewSet,
)

router = SimpleRouter()
router.register("runs", AnalyticsRunViewSet, basename="analytics-run")
router.register("lag-stats", DeliveryLagStatViewSet, basename="analytics-lag-stat")
router.register("duplicate-stats", DuplicateStatViewSet, basename="analytics-duplicate-stat")
router.register("relay-stats", RelayStatViewSet, basename="analytics-relay-stat")
router.register("findings", ReconciliationFindingViewSet, basename="analytics-finding")

urlpatterns = router.urls
