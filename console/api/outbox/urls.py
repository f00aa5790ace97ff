from rest_framework.routers import SimpleRouter

from console.api.failure_groups import OutboxFailureGroupViewSet
from console.api.outbox.views import OutboxEventViewSet

router = SimpleRouter()
router.register("events", OutboxEventViewSet, basename="outbox-event")
router.register("failure-groups", OutboxFailureGroupViewSet, basename="outbox-failure-group")

urlpatterns = router.urls
