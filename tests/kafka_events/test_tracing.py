"""kafka_events/tracing.py: the SDK is set up at process start only when OTEL_TRACES_EXPORTER asks.

Each case runs in a process of its own: OpenTelemetry's global tracer provider can be set
once per process."""

import ast
import http.server
import json
import os
import subprocess
import sys
import threading
from typing import ClassVar

import pytest
from django.conf import settings

# Sets tracing up as a process does at its start, makes one span and prints what it knows.
PROBE = """
import os
import sys
if os.environ.get("PROBE_BLOCKED_MODULE"):
    sys.modules[os.environ["PROBE_BLOCKED_MODULE"]] = None
import django
django.setup()
from django.conf import settings
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from kafka_events.tracing import active_tracer, configure_tracing
exported = configure_tracing(service_name="probe")
tracer = active_tracer()
if tracer is not None:
    with tracer.start_as_current_span("probe span"):
        pass
print("RESULT", exported, tracer is not None)
print(
    "INSTRUMENTED",
    *(f"{name}={instrumentor().is_instrumented_by_opentelemetry}" for name, instrumentor in
      (("django", DjangoInstrumentor), ("psycopg", PsycopgInstrumentor),
       ("celery", CeleryInstrumentor))),
)
print("MIDDLEWARE", settings.MIDDLEWARE)
if tracer is not None:
    from opentelemetry.instrumentation.django.middleware.otel_middleware import _DjangoMiddleware
    from opentelemetry.trace import SpanKind
    alone = tracer.start_span("statement alone", kind=SpanKind.CLIENT)
    with tracer.start_as_current_span("request", kind=SpanKind.SERVER) as request:
        within = tracer.start_span("statement within", kind=SpanKind.CLIENT)
        recorded = within.is_recording()
        within.end()
    print("CLIENT alone", alone.is_recording(), "within", recorded)
    excluded = _DjangoMiddleware._excluded_urls
    print("UNTRACED", *(url for url in ("http://h/metrics", "http://h/health/",
          "http://h/admin/", "http://h/api/metrics-like/") if excluded.url_disabled(url)))
"""


def probe(**environment: str) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=settings.BASE_DIR,
        env={**inherited, "DJANGO_SETTINGS_MODULE": "project.settings.test", **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )


def exported_span(output: str) -> dict:
    # The batch span processor exports at the process's exit, after the probe's lines: the
    # first span printed, as the console exporter indents it.
    start = output.index("\n{\n") + 1
    return json.loads(output[start : output.index("\n}\n", start) + 2])


def test_by_default_no_sdk_is_set_up_and_no_span_is_made():
    result = probe()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("RESULT False False\n")


def test_the_console_exporter_prints_the_spans_of_the_named_service():
    result = probe(OTEL_TRACES_EXPORTER="console")
    assert result.returncode == 0, result.stderr
    assert "RESULT True True" in result.stdout
    span = exported_span(result.stdout)
    assert span["name"] == "probe span"
    assert span["resource"]["attributes"]["service.name"] == "probe"


def test_otel_service_name_and_otel_sdk_disabled_are_obeyed():
    named = probe(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="payments")
    assert named.returncode == 0, named.stderr
    span = exported_span(named.stdout)
    assert span["resource"]["attributes"]["service.name"] == "payments"
    disabled = probe(OTEL_TRACES_EXPORTER="console", OTEL_SDK_DISABLED="true")
    assert disabled.stdout.startswith("RESULT False False\n")


def test_an_unknown_exporter_stops_the_process_with_advice():
    unknown = probe(OTEL_TRACES_EXPORTER="jaeger")
    assert unknown.returncode != 0
    assert "OTEL_TRACES_EXPORTER names jaeger" in unknown.stderr


@pytest.mark.parametrize(
    ("exporter", "module", "package"),
    [
        (
            "otlp",
            "opentelemetry.exporter.otlp.proto.http.trace_exporter",
            "opentelemetry-exporter-otlp-proto-http",
        ),
        ("zipkin", "opentelemetry.exporter.zipkin.json", "opentelemetry-exporter-zipkin-json"),
    ],
)
def test_an_exporter_that_is_not_installed_stops_the_process_naming_its_package(
    exporter, module, package
):
    # A module set to None in sys.modules cannot be imported: as if it were not installed.
    result = probe(OTEL_TRACES_EXPORTER=exporter, PROBE_BLOCKED_MODULE=module)
    assert result.returncode != 0
    assert f"OTEL_TRACES_EXPORTER={exporter} needs its exporter: pip install {package}" in (
        result.stderr
    )


class _Collector(http.server.BaseHTTPRequestHandler):
    """Stands for an OpenTelemetry collector: keeps what is posted to it."""

    posted: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.posted.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_otlp_exporter_posts_the_spans_to_the_configured_endpoint():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    _Collector.posted.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        result = probe(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    assert "RESULT True True" in result.stdout
    [(path, content_type, body)] = _Collector.posted
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    request = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "probe"
    names = [span.name for scope in resource_spans.scope_spans for span in scope.spans]
    # The probe's CLIENT span without a parent is not among them.
    assert names == ["probe span", "statement within", "request"]


def test_a_traced_process_turns_on_the_django_psycopg_and_celery_instrumentations():
    result = probe(OTEL_TRACES_EXPORTER="console")
    assert result.returncode == 0, result.stderr
    assert "INSTRUMENTED django=True psycopg=True celery=True" in result.stdout
    middleware = ast.literal_eval(result.stdout.split("MIDDLEWARE ", 1)[1].split("\n")[0])
    # First: the request's span is open around every other middleware.
    assert middleware[0].startswith("opentelemetry.instrumentation.django.")


def test_instrumentations_named_in_otel_python_disabled_instrumentations_stay_off():
    result = probe(
        OTEL_TRACES_EXPORTER="console", OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="psycopg,celery"
    )
    assert result.returncode == 0, result.stderr
    assert "INSTRUMENTED django=True psycopg=False celery=False" in result.stdout


def test_an_untraced_process_turns_on_no_instrumentation():
    result = probe()
    assert result.returncode == 0, result.stderr
    assert "INSTRUMENTED django=False psycopg=False celery=False" in result.stdout


def test_a_client_span_is_recorded_within_a_trace_only():
    # An SQL statement of the relay's polling, outside any span, would be a trace of its own.
    result = probe(OTEL_TRACES_EXPORTER="console")
    assert result.returncode == 0, result.stderr
    assert "CLIENT alone False within True" in result.stdout
    sampled_out = probe(OTEL_TRACES_EXPORTER="console", OTEL_TRACES_SAMPLER="always_off")
    assert "CLIENT alone False within False" in sampled_out.stdout


def test_scrapes_and_probes_are_not_traced_unless_the_variables_say_otherwise():
    result = probe(OTEL_TRACES_EXPORTER="console")
    assert result.returncode == 0, result.stderr
    assert "UNTRACED http://h/metrics http://h/health/\n" in result.stdout
    chosen = probe(OTEL_TRACES_EXPORTER="console", OTEL_PYTHON_DJANGO_EXCLUDED_URLS="admin")
    assert "UNTRACED http://h/admin/\n" in chosen.stdout
