from rest_framework.routers import SimpleRouter

from inbox.api.views import InboxMessageViewSet

router = SimpleRouter()
router.register("messages", InboxMessageViewSet, basename="inbox-message")

urlpatterns = router.urls
