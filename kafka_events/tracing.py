"""OpenTelemetry for every process: the SDK set up at process start when OpenTelemetry's
standard environment variables ask for an exporter (OTEL_TRACES_EXPORTER, read here as the SDK
reads its own), the tracer the apps make their spans with, and the log filter that writes a
line's trace and span ids.

The apps make spans through opentelemetry-api only, and ask `active_tracer()` first: with no
SDK configured it answers None, once per batch, and the relay and the consumers then do no
per-event tracing work at all (their hot loops run tens of thousands of events a second).
"""

import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.util.types import Attributes

logger = logging.getLogger(__name__)

# The instrumentation scope of the spans the apps make.
INSTRUMENTATION_NAME = "django-outbox"
SUPPORTED_EXPORTERS = frozenset({"none", "console", "otlp", "zipkin"})
# OpenTelemetry's instrumentations a configured process turns on (all installed by
# requirements.txt), unless OTEL_PYTHON_DISABLED_INSTRUMENTATIONS names them: a span per
# request (it becomes the parent of the events the request publishes), per SQL statement,
# per Celery task.
INSTRUMENTATIONS = ("django", "psycopg", "celery")
# Requests Django's instrumentation leaves untraced, unless OTEL_PYTHON_DJANGO_EXCLUDED_URLS
# (or OTEL_PYTHON_EXCLUDED_URLS) says otherwise: regular expressions searched in the URL.
UNTRACED_URLS = "/metrics$,/health/$"

_lock = threading.Lock()
# A provider given by use_tracer_provider(), in place of the global one.
_override: trace.TracerProvider | None = None
_tracers: dict[int, tuple[trace.TracerProvider, trace.Tracer]] = {}
_configured_pid: int | None = None


def _environment_list(name: str) -> list[str]:
    """A comma-separated variable's items, stripped, the empty ones left out."""
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _environment_bool(name: str) -> bool:
    # As OpenTelemetry's specification reads a boolean: "true" in any case, else false.
    return os.environ.get(name, "").strip().lower() == "true"


class TracingNotAvailable(Exception):
    """The exporter asked for is not installed."""

    code = "tracing_not_available"


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Makes `provider` the one spans are made with in this process (None: the global one
    again). OpenTelemetry's global provider can be set once per process; a test or a
    benchmark that compares runs with and without an SDK swaps providers here instead."""
    global _override
    with _lock:
        _override = provider
        _tracers.clear()


def _recording(provider: trace.TracerProvider) -> bool:
    # The API's own providers make no spans: the proxy before an SDK is set, the no-op one.
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def active_tracer() -> trace.Tracer | None:
    """The tracer to make spans with, or None when no SDK is configured (spans would be
    no-ops): call once per batch, not per event."""
    provider = _override or trace.get_tracer_provider()
    if not _recording(provider):
        return None
    cached = _tracers.get(id(provider))
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = provider.get_tracer(INSTRUMENTATION_NAME)
    _tracers[id(provider)] = (provider, tracer)
    return tracer


# A traceparent of version 00 without a tracestate is read here directly: the relay and the
# consumers read one per event, and the propagator's general parse costs twice as much.
SIMPLE_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
# Whatever OTEL_PROPAGATORS says, events carry W3C trace context: consumers read those headers.
W3C = TraceContextTextMapPropagator()
# The messaging.system attribute of every span of publish, the relay and the consumers.
MESSAGING_SYSTEM = "kafka"


def sampling_attributes(operation: str, topic: str) -> dict[str, str]:
    """The attributes a messaging span starts with, those a sampler may decide on (the
    conventions' list); the relay and the consumers add the others only to a recorded span,
    so that a span sampled out costs little more than the sampler's decision."""
    return {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": topic,
    }


def context_from_headers(headers: Mapping[str, str]) -> Context | None:
    """The span context an event's or a record's headers carry (W3C traceparent and
    tracestate), or None when they carry none that is valid."""
    traceparent = headers.get("traceparent")
    if not traceparent:
        return None
    match = SIMPLE_TRACEPARENT.match(traceparent)
    if match is None or "tracestate" in headers:
        context = W3C.extract(headers)
        if not trace.get_current_span(context).get_span_context().is_valid:
            return None
        return context
    trace_id, span_id = int(match.group(1), 16), int(match.group(2), 16)
    if not trace_id or not span_id:
        return None
    span_context = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(int(match.group(3), 16))
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


def trace_id_from_headers(headers: Mapping[str, str] | None) -> str | None:
    """The trace id (32 hex digits) of the context that headers carry, or None."""
    context = context_from_headers(headers or {})
    if context is None:
        return None
    return trace.format_trace_id(trace.get_current_span(context).get_span_context().trace_id)


def configure_tracing(*, service_name: str) -> bool:
    """Installs the SDK's tracer provider, with a batch span processor per exporter, when
    OTEL_TRACES_EXPORTER names one ("console", "otlp", "zipkin", comma-separated; "none" or
    unset: none) and OTEL_SDK_DISABLED is not "true"; does nothing otherwise (the API stays a
    no-op). OTEL_SERVICE_NAME, when set, names the spans' service in place of `service_name`.
    Call at process start, once settings are loaded; a second call in the same process does
    nothing. Returns whether spans are now exported."""
    global _configured_pid
    exporters = [name.lower() for name in _environment_list("OTEL_TRACES_EXPORTER")]
    if _environment_bool("OTEL_SDK_DISABLED") or not exporters or exporters == ["none"]:
        return False
    unknown = sorted(set(exporters) - SUPPORTED_EXPORTERS)
    if unknown:
        raise TracingNotAvailable(
            f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}; this project exports spans "
            "with 'console' or 'otlp' (or 'none')."
        )
    with _lock:
        if _configured_pid is not None:
            return True
        # Imported here: a process that exports nothing never loads the SDK.
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        provider = TracerProvider(
            resource=Resource.create(
                {SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name}
            ),
            sampler=_client_spans_within_traces(),
        )
        for name in exporters:
            if name == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            else:
                provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        trace.set_tracer_provider(provider)
        instrumented = _instrument(provider)
        _configured_pid = os.getpid()
    logger.info(
        "Tracing: spans of %s exported to %s; instrumented: %s",
        service_name,
        ", ".join(exporters),
        ", ".join(instrumented) or "nothing",
    )
    return True


def _client_spans_within_traces() -> "Sampler":
    """The sampler OTEL_TRACES_SAMPLER configures, except that a CLIENT span without a parent
    is dropped: an SQL statement is recorded as a part of a trace (a request, a handler, a
    Celery task), never as a trace of its own. The relay and the consumers poll the database
    several times a second outside any span; each statement would otherwise be a trace."""
    from opentelemetry.sdk.trace.sampling import (
        Decision,
        Sampler,
        SamplingResult,
        _get_from_env_or_default,
    )

    configured = _get_from_env_or_default()

    class ClientSpansWithinTraces(Sampler):
        def should_sample(
            self,
            parent_context: Context | None,
            trace_id: int,
            name: str,
            kind: trace.SpanKind | None = None,
            attributes: "Attributes" = None,
            links: Sequence[trace.Link] | None = None,
            trace_state: trace.TraceState | None = None,
        ) -> SamplingResult:
            parent = trace.get_current_span(parent_context).get_span_context()
            if kind is trace.SpanKind.CLIENT and not parent.is_valid:
                return SamplingResult(Decision.DROP)
            return configured.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"ClientSpansWithinTraces{{{configured.get_description()}}}"

    return ClientSpansWithinTraces()


def _exporter(name: str) -> "SpanExporter":
    """The OTLP (over HTTP) or Zipkin exporter; each reads its endpoint from the standard
    variable, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_ZIPKIN_ENDPOINT."""
    try:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter()
        from opentelemetry.exporter.zipkin.json import ZipkinExporter

        return ZipkinExporter()
    except ImportError as error:
        package = {
            "otlp": "opentelemetry-exporter-otlp-proto-http",
            "zipkin": "opentelemetry-exporter-zipkin-json",
        }[name]
        raise TracingNotAvailable(
            f"OTEL_TRACES_EXPORTER={name} needs its exporter: pip install {package}."
        ) from error


def _instrument(provider: trace.TracerProvider) -> list[str]:
    """Turns on the instrumentations of INSTRUMENTATIONS that are installed and not disabled
    by OTEL_PYTHON_DISABLED_INSTRUMENTATIONS; returns their names.

    Before the WSGI application loads its middleware (project/wsgi.py), so that Django's
    request span wraps every request; before the first connection, so that psycopg's
    statements are spans."""
    disabled = set(_environment_list("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"))
    # Django's instrumentation reads these itself; UNTRACED_URLS only stands in for them.
    excluded_urls_set = bool(
        os.environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS")
        or os.environ.get("OTEL_PYTHON_EXCLUDED_URLS")
    )
    turned_on = []
    for name in INSTRUMENTATIONS:
        if name in disabled or "*" in disabled:
            continue
        try:
            instrumentor = _instrumentor(name)
        except ImportError:
            logger.warning("Tracing: the %s instrumentation is not installed", name)
            continue
        options: dict[str, Any] = {"tracer_provider": provider}
        if name == "django" and not excluded_urls_set:
            # Scrapes and probes, every few seconds, are not traces worth keeping.
            options["excluded_urls"] = UNTRACED_URLS
        instrumentor.instrument(**options)
        turned_on.append(name)
    return turned_on


class _Instrumentor(Protocol):
    """What is used of opentelemetry-instrumentation's BaseInstrumentor."""

    def instrument(self, **kwargs: Any) -> None: ...


def _instrumentor(name: str) -> _Instrumentor:
    if name == "django":
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        return DjangoInstrumentor()
    if name == "psycopg":
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        return PsycopgInstrumentor()
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    return CeleryInstrumentor()


class TraceContextFilter(logging.Filter):
    """Gives every log record `trace_id` and `span_id` (hex, empty outside a span) and
    `trace_context`, the text a line ends with: " trace_id=... span_id=..." inside a
    recording span, nothing outside one."""

    def filter(self, record: logging.LogRecord) -> bool:
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            trace_id = trace.format_trace_id(span_context.trace_id)
            span_id = trace.format_span_id(span_context.span_id)
            text = f" trace_id={trace_id} span_id={span_id}"
        else:
            trace_id = span_id = text = ""
        record.__dict__.update(trace_id=trace_id, span_id=span_id, trace_context=text)
        return True
