"""The operators' console: REST API, OpenAPI, throttling, body limits, health checks, metrics."""

from project.settings.environment import env

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": (
        # `Authorization: Token <token>`: tokens hashed at rest (console.models.ApiToken).
        # First, so that a request without valid credentials gets 401 with WWW-Authenticate.
        "knox.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ),
    # Every endpoint needs a user; reads need the model's view permission, actions their own.
    "DEFAULT_PERMISSION_CLASSES": ("console.api.permissions.ConsolePermission",),
    "DEFAULT_PAGINATION_CLASS": "console.api.pagination.ConsoleCursorPagination",
    "PAGE_SIZE": env.int("API_PAGE_SIZE", default=50),
    "DEFAULT_FILTER_BACKENDS": ("console.api.filters.StrictFilterBackend",),
    # The error answers of every operation, with their body (console.api.schema).
    "DEFAULT_SCHEMA_CLASS": "console.api.schema.ConsoleAutoSchema",
    "EXCEPTION_HANDLER": "console.api.exceptions.api_exception_handler",
    "DEFAULT_RENDERER_CLASSES": (
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ),
    # An unknown ?format= is 406, like an Accept header the API cannot answer.
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "console.api.negotiation.ConsoleContentNegotiation",
    "DEFAULT_THROTTLE_CLASSES": (
        "rest_framework.throttling.AnonRateThrottle",
        "rest_framework.throttling.UserRateThrottle",
        "rest_framework.throttling.ScopedRateThrottle",
    ),
    "DEFAULT_THROTTLE_RATES": {
        "anon": env("API_THROTTLE_ANON", default="30/minute"),
        "user": env("API_THROTTLE_USER", default="1200/minute"),
        # Actions that change rows, bulk ones included.
        "actions": env("API_THROTTLE_ACTIONS", default="120/minute"),
    },
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Event delivery console API",
    "DESCRIPTION": (
        "Outbox events and inbox messages: lists, details, and the operators' repairs "
        "(retry, discard, replay), singly and in bulk by filter."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Swagger UI from drf-spectacular-sidecar's static files: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Outbox, inbox and analytics runs each have a "status" with its own choices.
    "ENUM_NAME_OVERRIDES": {
        "DeliveryStatusEnum": "outbox.models.OutboxEvent.Status",
        "AnalyticsRunStatusEnum": "analytics.models.AnalyticsRun.Status",
        "InboxMessageStatusEnum": "inbox.models.InboxMessage.Status",
    },
}

# Request bodies above this many bytes get 400: a JSON error with code request_too_large (API).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=256 * 1024)
# An API bulk request may name at most this many ids; larger sets go by filter.
API_BULK_MAX_IDS = env.int("API_BULK_MAX_IDS", default=1000)

# Bulk actions run synchronously up to one chunk; larger sets are frozen into chunks of this
# many ids, which a Celery task (console.tasks.run_bulk_operation) applies one transaction
# each, tracked as a bulk operation (progress, cancel) and in the audit log.
CONSOLE_BULK_CHUNK_SIZE = env.int("CONSOLE_BULK_CHUNK_SIZE", default=1000)
# The rate cap of a bulk operation, in rows per second: the task pauses between chunks to stay
# under it, so a retry of 100,000 events neither floods the relay nor starves the database's
# other writers. 0 applies the chunks back to back.
CONSOLE_BULK_MAX_ROWS_PER_SECOND = env.int("CONSOLE_BULK_MAX_ROWS_PER_SECOND", default=5000)
# A bulk action refuses a filter that matches more rows than this; narrow the filter.
CONSOLE_BULK_MAX_ROWS = env.int("CONSOLE_BULK_MAX_ROWS", default=1_000_000)
# A running bulk operation whose worker died (no process holds its run) is queued again, to
# resume at its first chunk not applied, by the beat task console.reap_bulk_operations; after
# this many resumes it is marked FAILED instead (a chunk that kills its worker every time must
# not run forever). 0: never resumed, failed at once.
CONSOLE_BULK_MAX_RESUMES = env.int("CONSOLE_BULK_MAX_RESUMES", default=3)
# Fields of payloads and headers shown masked to everyone (console/privacy.py), comma-separated
# paths: CONSOLE_MASKED_FIELDS=payload.customer.email,payload.items.*.card,headers.authorization
# Payloads and headers at all only to users with console.view_payload.
CONSOLE_MASKED_FIELDS: list[str] = env.list("CONSOLE_MASKED_FIELDS", default=[])
# Lists count exactly up to this many matches and show "more than" beyond; an unfiltered
# list shows PostgreSQL's estimate of the table's size.
CONSOLE_COUNT_LIMIT = env.int("CONSOLE_COUNT_LIMIT", default=10_000)
# Kafka calls of the dashboard and the lag endpoint give up after this long.
CONSOLE_KAFKA_TIMEOUT_SECONDS = env.float("CONSOLE_KAFKA_TIMEOUT_SECONDS", default=2.0)
# Consumer groups whose lag is shown, besides the groups with handlers in this process.
CONSOLE_CONSUMER_GROUPS: list[str] = env.list("CONSOLE_CONSUMER_GROUPS", default=[])
# Lag and health of Kafka are cached this long, so a refreshing dashboard does not hammer it.
CONSOLE_KAFKA_CACHE_SECONDS = env.float("CONSOLE_KAFKA_CACHE_SECONDS", default=5.0)
# The dashboard's slower reads (quarantined keys, failures by class, the day's rates) are
# cached this long; 0 reads them on every page view.
CONSOLE_DASHBOARD_CACHE_SECONDS = env.float("CONSOLE_DASHBOARD_CACHE_SECONDS", default=10.0)
# Health colours: amber past the first number, red past the second. Beat's heartbeat is
# written on its ticks (at least every 5 s; console/beat.py).
CONSOLE_BEAT_STALE_SECONDS = env.list(
    "CONSOLE_BEAT_STALE_SECONDS", cast=float, default=[15.0, 60.0]
)
CONSOLE_PENDING_AGE_SECONDS = env.list(
    "CONSOLE_PENDING_AGE_SECONDS", cast=float, default=[60.0, 600.0]
)
# /metrics and /health/ need `Authorization: Bearer <token>` when these are set. Without
# one, they answer anyone, except where MONITORING_OPEN_WITHOUT_TOKEN is false (production):
# there they answer 403 until their token is set.
METRICS_TOKEN = env("METRICS_TOKEN", default="")
HEALTH_TOKEN = env("HEALTH_TOKEN", default="")
MONITORING_OPEN_WITHOUT_TOKEN = True
# /health/ answers from its last run of the checks for this long: a busy probe or a refreshing
# page does not open a connection to each service per request.
HEALTH_CACHE_SECONDS = env.float("HEALTH_CACHE_SECONDS", default=5.0)
