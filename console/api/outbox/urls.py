from rest_framework.routers import SimpleRouter

from console.api.outbox.views import OutboxEventViewSet

router = SimpleRouter()
router.register("events", OutboxEventViewSet, basename="outbox-event")

urlpatterns = router.urls
