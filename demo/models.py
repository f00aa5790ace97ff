import uuid

from django.db import models
from django.utils import timezone


class Payment(models.Model):
    """The payments service's business row, written with its event in one transaction."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    order_id = models.CharField(max_length=64)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    completed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "demo_payment"
        ordering = ("-completed_at",)

    def __str__(self) -> str:
        return f"payment {self.id} of order {self.order_id}"


class Delivery(models.Model):
    """The delivery service's row, created by the handler of PaymentCompleted."""

    payment_id = models.UUIDField(unique=True)
    order_id = models.CharField(max_length=64)
    # The event that started it: shows that each payment starts exactly one delivery.
    event_id = models.CharField(max_length=255)
    started_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "demo_delivery"
        verbose_name_plural = "deliveries"
        ordering = ("-started_at",)

    def __str__(self) -> str:
        return f"delivery of payment {self.payment_id}"
