"""W3C trace context for events: a `traceparent` in the caller's context travels with the
event as a Kafka header, so a consumer's work joins the trace of the request that caused it."""

import functools
import re
from collections.abc import Callable
from contextvars import ContextVar
from types import ModuleType

from django.http import HttpRequest, HttpResponse

TRACEPARENT_HEADER = "traceparent"
# version-traceid-parentid-flags, https://www.w3.org/TR/trace-context/#traceparent-header
TRACEPARENT_PATTERN = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

current_traceparent: ContextVar[str | None] = ContextVar("current_traceparent", default=None)


@functools.cache
def _opentelemetry_propagate() -> ModuleType | None:
    # Looked up once: a failed import is not cached by Python, and repeating it on every
    # publish() cost a quarter of a millisecond each time.
    try:
        from opentelemetry import propagate  # type: ignore[import-not-found]
    except ImportError:
        return None
    return propagate


def caller_traceparent() -> str | None:
    """The traceparent of the current context: OpenTelemetry's active span when it is
    installed, else the one TraceContextMiddleware (or the caller) set."""
    propagate = _opentelemetry_propagate()
    if propagate is None:
        return current_traceparent.get()
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT_HEADER) or current_traceparent.get()


class TraceContextMiddleware:
    """Makes an incoming request's valid `traceparent` header the context of its events."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        traceparent = request.headers.get(TRACEPARENT_HEADER, "").strip().lower()
        if not TRACEPARENT_PATTERN.match(traceparent):
            return self.get_response(request)
        token = current_traceparent.set(traceparent)
        try:
            return self.get_response(request)
        finally:
            current_traceparent.reset(token)
