"""Settings shared by every environment. Integration settings live in their own modules."""

from project.settings.analytics import *  # noqa: F403
from project.settings.api import *  # noqa: F403
from project.settings.celery import *  # noqa: F403
from project.settings.database import *  # noqa: F403
from project.settings.demo import *  # noqa: F403
from project.settings.environment import BASE_DIR, env
from project.settings.inbox import *  # noqa: F403
from project.settings.kafka import *  # noqa: F403
from project.settings.outbox import *  # noqa: F403
from project.settings.schedule import *  # noqa: F403
from project.settings.security import *  # noqa: F403
from project.settings.spark import *  # noqa: F403
from project.settings.tracing import *  # noqa: F403

# Only for development: production.py requires a real SECRET_KEY from the environment.
SECRET_KEY = env("SECRET_KEY", default="django-insecure-development-only-key-change-me")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS: list[str] = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS: list[str] = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    # The console's templates override Unfold's admin index (the dashboard): it comes first.
    "console",
    # Unfold's admin theme must come before django.contrib.admin.
    "unfold",
    "unfold.contrib.filters",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "rest_framework",
    "knox",
    "axes",
    "csp",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "health_check",
    "outbox",
    "inbox",
    "analytics",
]
# The demo (payments and deliveries) only where it is wanted: production.py switches it off.
if DEMO_ENABLED:  # noqa: F405
    INSTALLED_APPS.append("demo")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy on every response, with a nonce per response for inline scripts.
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # API request bodies over DATA_UPLOAD_MAX_MEMORY_SIZE get 400 and a JSON error
    # (code request_too_large), as Django answers a body over the limit elsewhere.
    "console.api.middleware.BodySizeLimitMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A request's W3C traceparent travels with the events it publishes.
    "outbox.tracing.TraceContextMiddleware",
    # Refuses a locked-out login with the lock-out page (django-axes); it must come last.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # {{ CSP_NONCE }} for the console's own inline scripts.
                "csp.context_processors.nonce",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    # OWASP ASVS 2.1.1: at least 12 characters (docs/security.md).
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
# Times in the console to the microsecond, in UTC: project/formats/en/formats.py.
FORMAT_MODULE_PATH = ["project.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # A line written inside a span (the relay's send, a consumer's process) ends with its
    # trace_id and span_id, to find the trace from the log and the log from the trace.
    "filters": {"trace_context": {"()": "kafka_events.tracing.TraceContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s%(trace_context)s"}
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["trace_context"],
        }
    },
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    # django-axes announces its version at every process start (each relay, consumer and
    # management command); its lock-outs and failed logins log under other names.
    "loggers": {"axes.apps": {"level": "WARNING"}},
}

UNFOLD = {
    "SITE_TITLE": "Event delivery",
    "SITE_HEADER": "Event delivery",
    # The dashboard: counts, rates, failures, quarantined keys, consumer lag, health.
    "DASHBOARD_CALLBACK": "console.dashboard.dashboard_callback",
}
