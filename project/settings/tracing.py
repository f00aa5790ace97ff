"""OpenTelemetry tracing (docs/tracing.md): spans of publish, the relay and the consumers.

The code makes its spans through opentelemetry-api only. A process records and exports them
only when an exporter is asked for here; otherwise the API stays a no-op and costs nothing.
The SDK itself reads the other standard variables: OTEL_TRACES_SAMPLER and
OTEL_TRACES_SAMPLER_ARG, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_* (the batch span processor) and
OTEL_EXPORTER_OTLP_* (the OTLP exporter, when installed).
"""

from project.settings.environment import env

# "none" (the default: no SDK, no spans), or any of "console" (spans printed as JSON on
# stdout), "otlp" (OTLP over HTTP, to OTEL_EXPORTER_OTLP_ENDPOINT) and "zipkin" (to
# OTEL_EXPORTER_ZIPKIN_ENDPOINT), comma-separated.
TRACING_EXPORTERS: list[str] = env.list("OTEL_TRACES_EXPORTER", default=["none"])
# The service.name of this process's spans; empty: each kind of process names itself
# (web, celery, outbox-relay, inbox-consumer).
TRACING_SERVICE_NAME = env("OTEL_SERVICE_NAME", default="")
# The standard switch that turns the SDK off whatever else is set.
TRACING_SDK_DISABLED = env.bool("OTEL_SDK_DISABLED", default=False)
# Instrumentations not to turn on when tracing: any of django, psycopg, celery (or *).
TRACING_DISABLED_INSTRUMENTATIONS: list[str] = env.list(
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", default=[]
)
# The console's link from an event or a message to its trace in the tracing backend: a URL
# with {trace_id} (32 hex digits), e.g. http://127.0.0.1:9411/zipkin/traces/{trace_id} for
# Zipkin or https://jaeger.example.com/trace/{trace_id}. Empty: the trace id is shown as text.
CONSOLE_TRACE_URL_TEMPLATE = env("CONSOLE_TRACE_URL_TEMPLATE", default="")
# Whether the Django requests not to trace are given (else kafka_events.tracing.UNTRACED_URLS).
TRACING_DJANGO_EXCLUDED_URLS_SET = bool(
    env("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", default="")
    or env("OTEL_PYTHON_EXCLUDED_URLS", default="")
)
