from rest_framework.routers import SimpleRouter

from console.api.inbox.views import InboxMessageViewSet

router = SimpleRouter()
router.register("messages", InboxMessageViewSet, basename="inbox-message")

urlpatterns = router.urls
