"""Production settings. Start-up stops, naming the variable, when one of
PRODUCTION_REQUIRED_VARIABLES is missing from the environment."""

from project.settings.base import *  # noqa: F403
from project.settings.environment import env

# No defaults: environ raises ImproperlyConfigured("Set the <NAME> environment variable").
SECRET_KEY = env("SECRET_KEY")
DATABASES = {"default": env.db("DATABASE_URL")}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"]["OPTIONS"] = {**DATABASE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}  # noqa: F405
KAFKA_EVENTS = {**KAFKA_EVENTS, "BOOTSTRAP_SERVERS": env("KAFKA_BOOTSTRAP_SERVERS")}  # noqa: F405

DEBUG = False

# No demo traffic, tables or handlers in production unless asked for explicitly.
DEMO_ENABLED = env.bool("DEMO_ENABLED", default=False)
INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "demo" or DEMO_ENABLED]  # noqa: F405
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS")

# HTTPS everywhere; a TLS-terminating proxy in front sets X-Forwarded-Proto. HTTPS=false
# is only for trying the stack on plain http://localhost (docker compose up).
HTTPS = env.bool("HTTPS", default=True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=60 * 60 * 24 * 365) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
X_FRAME_OPTIONS = "DENY"

# /metrics and /health/ tell an outsider what runs and how it fails: closed until
# METRICS_TOKEN and HEALTH_TOKEN are set.
MONITORING_OPEN_WITHOUT_TOKEN = False
