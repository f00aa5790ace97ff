"""The payments endpoint: a payment and its event from an HTTP request, the request's trace
id, and bad input refused with a 400 that says what was wrong."""

import pytest
from django.urls import reverse

from demo.models import Payment
from outbox.models import OutboxEvent

pytestmark = pytest.mark.django_db

URL = "/demo/payments/"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_endpoint_is_where_the_urls_say():
    assert reverse("demo:payment-create") == URL


def test_a_post_completes_a_payment_and_publishes_its_event(client):
    response = client.post(
        URL, {"order_id": "order-7", "amount": "12.50"}, content_type="application/json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    payment = Payment.objects.get()
    assert body == {
        "payment_id": str(payment.id),
        "order_id": "order-7",
        "amount": "12.50",
        "trace_id": None,
    }
    event = OutboxEvent.objects.get()
    assert (event.event_type, event.aggregate_id) == ("PaymentCompleted", str(payment.id))


def test_the_request_traceparent_is_the_events_and_its_trace_id_is_answered(client):
    response = client.post(
        URL,
        {"order_id": "order-8", "amount": "3.00"},
        content_type="application/json",
        headers={"traceparent": TRACEPARENT},
    )
    assert response.status_code == 201, response.content
    assert response.json()["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert OutboxEvent.objects.get().headers["traceparent"] == TRACEPARENT


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"amount": "1.00"}, "order_id"),
        ({"order_id": "o", "amount": "0"}, "amount"),
        ({"order_id": "o", "amount": "-5"}, "amount"),
        ({"order_id": "o", "amount": "abc"}, "amount"),
        ({"order_id": "o", "amount": "1e400"}, "amount"),
        ({"order_id": "x" * 65, "amount": "1.00"}, "order_id"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_written(client, body, field):
    response = client.post(URL, body, content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["code"] == "validation_error"
    assert field in error["message"]
    assert not Payment.objects.exists()
    assert not OutboxEvent.objects.exists()


def test_a_body_that_is_not_json_is_a_400(client):
    response = client.post(URL, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"


def test_the_demo_endpoint_is_not_in_the_api_schema(admin_client):
    schema = admin_client.get("/api/schema/", headers={"accept": "application/json"})
    assert schema.status_code == 200
    assert "/demo/" not in str(schema.json()["paths"])
