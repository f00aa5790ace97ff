from rest_framework.routers import SimpleRouter

from outbox.api.views import OutboxEventViewSet

router = SimpleRouter()
router.register("events", OutboxEventViewSet, basename="outbox-event")

urlpatterns = router.urls
