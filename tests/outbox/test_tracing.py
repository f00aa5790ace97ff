import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from outbox.tracing import TraceContextMiddleware, caller_traceparent

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("header", "seen"),
    [(TRACEPARENT, TRACEPARENT), ("garbage", None), ("", None)],
)
def test_the_middleware_sets_a_valid_traceparent_for_the_request_only(header, seen):
    observed = []

    def view(request):
        observed.append(caller_traceparent())
        return HttpResponse()

    request = RequestFactory().get("/", headers={"traceparent": header} if header else {})
    TraceContextMiddleware(view)(request)
    assert observed == [seen]
    assert caller_traceparent() is None
