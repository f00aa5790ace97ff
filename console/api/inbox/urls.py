from rest_framework.routers import SimpleRouter

from console.api.failure_groups import InboxFailureGroupViewSet
from console.api.inbox.views import HeldKeyViewSet, InboxMessageViewSet

router = SimpleRouter()
router.register("messages", InboxMessageViewSet, basename="inbox-message")
router.register("held-keys", HeldKeyViewSet, basename="inbox-held-key")
router.register("failure-groups", InboxFailureGroupViewSet, basename="inbox-failure-group")

urlpatterns = router.urls
