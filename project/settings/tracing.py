"""OpenTelemetry tracing (docs/tracing.md): spans of publish, the relay and the consumers.

The code makes its spans through opentelemetry-api only. A process records and exports them
only when OpenTelemetry's standard variables ask for an exporter; kafka_events/tracing.py reads
them from the environment, as the SDK reads its own: OTEL_TRACES_EXPORTER ("none", the
default, or any of "console", "otlp", "zipkin", comma-separated), OTEL_SERVICE_NAME,
OTEL_SDK_DISABLED, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS (any of django, psycopg, celery, or *)
and OTEL_PYTHON_DJANGO_EXCLUDED_URLS. The SDK itself reads the others: OTEL_TRACES_SAMPLER and
OTEL_TRACES_SAMPLER_ARG, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_* (the batch span processor) and
OTEL_EXPORTER_OTLP_* (the OTLP exporter, when installed).
"""

from project.settings.environment import env

# The console's link from an event or a message to its trace in the tracing backend: a URL
# with {trace_id} (32 hex digits), e.g. http://127.0.0.1:9411/zipkin/traces/{trace_id} for
# Zipkin or https://jaeger.example.com/trace/{trace_id}. Empty: the trace id is shown as text.
CONSOLE_TRACE_URL_TEMPLATE = env("CONSOLE_TRACE_URL_TEMPLATE", default="")
