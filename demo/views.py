"""The payments service's HTTP endpoint: a request that completes a payment. With tracing on,
its trace runs from this request through the relay and the delivery handler to the
DeliveryStarted event (docs/tracing.md)."""

from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from demo.services import payment_complete
from outbox.tracing import caller_traceparent


class PaymentRequestSerializer(serializers.Serializer[Any]):
    order_id = serializers.CharField(max_length=64)
    amount = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=Decimal("0.01"))


# Not part of the console's API (its schema and contract test): the demo's own business call,
# installed only with the demo (DEMO_ENABLED).
@extend_schema(exclude=True)
class PaymentCreateView(APIView):
    """POST {"order_id": ..., "amount": "12.50"}: 201 with the payment, and the trace id of
    the request (null when no trace context is active)."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    def post(self, request: Request) -> Response:
        serializer = PaymentRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        payment = payment_complete(**serializer.validated_data)
        traceparent = caller_traceparent()
        return Response(
            {
                "payment_id": str(payment.id),
                "order_id": payment.order_id,
                "amount": str(payment.amount),
                "trace_id": traceparent.split("-")[1] if traceparent else None,
            },
            status=status.HTTP_201_CREATED,
        )
