"""The delivery service's inbox handler. Registered only when DEMO_ENABLED (the app itself is
installed only then; the check keeps an explicit import from registering it either)."""

from django.conf import settings

from inbox import handler
from inbox.models import InboxMessage

if settings.DEMO_ENABLED:

    @handler(
        event_type="PaymentCompleted",
        topic=settings.DEMO_PAYMENTS_TOPIC,
        group=settings.DEMO_DELIVERY_GROUP,
    )
    def start_delivery(message: InboxMessage) -> None:
        from demo.services import delivery_start

        delivery_start(message=message)
