"""project/tracing.py: the SDK is set up at process start only when OTEL_TRACES_EXPORTER asks.

Each case runs in a process of its own: OpenTelemetry's global tracer provider can be set
once per process."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

# Sets tracing up as a process does at its start, makes one span and prints what it knows.
PROBE = """
import django
django.setup()
from project.tracing import active_tracer, configure_tracing
exported = configure_tracing(service_name="probe")
tracer = active_tracer()
if tracer is not None:
    with tracer.start_as_current_span("probe span"):
        pass
print("RESULT", exported, tracer is not None)
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
    # The batch span processor exports at the process's exit, after the RESULT line.
    return json.loads(output.split("\n", 1)[1])


def test_by_default_no_sdk_is_set_up_and_no_span_is_made():
    result = probe()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "RESULT False False"


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
    assert disabled.stdout.strip() == "RESULT False False"


def test_an_exporter_that_cannot_be_had_stops_the_process_with_advice():
    unknown = probe(OTEL_TRACES_EXPORTER="zipkin")
    assert unknown.returncode != 0
    assert "OTEL_TRACES_EXPORTER names zipkin" in unknown.stderr


def _otlp_exporter_installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp") is not None
    except ModuleNotFoundError:  # not even the namespace package of exporters
        return False


@pytest.mark.skipif(
    _otlp_exporter_installed(),
    reason="an OTLP exporter is installed here",
)
def test_the_otlp_exporter_asks_for_its_package_when_it_is_not_installed():
    result = probe(OTEL_TRACES_EXPORTER="otlp")
    assert result.returncode != 0
    assert "pip install opentelemetry-exporter-otlp-proto-http" in result.stderr
