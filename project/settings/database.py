from project.settings.environment import env

DEFAULT_DATABASE_URL = "postgres://outbox:outbox@127.0.0.1:5432/outbox"

DATABASES = {
    "default": env.db("DATABASE_URL", default=DEFAULT_DATABASE_URL),
}
# Persistent connections: the relay and the consumers run short transactions in a loop.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
