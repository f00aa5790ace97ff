from django.urls import path

from demo.views import PaymentCreateView

app_name = "demo"
urlpatterns = [
    path("payments/", PaymentCreateView.as_view(), name="payment-create"),
]
