from django.contrib import admin
from unfold.admin import ModelAdmin

from demo.models import Delivery, Payment


@admin.register(Payment)
class PaymentAdmin(ModelAdmin):
    list_display = ("id", "order_id", "amount", "completed_at")
    show_full_result_count = False


@admin.register(Delivery)
class DeliveryAdmin(ModelAdmin):
    list_display = ("id", "payment_id", "order_id", "event_id", "started_at")
    show_full_result_count = False
