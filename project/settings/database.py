from project.settings.environment import env

DEFAULT_DATABASE_URL = "postgres://outbox:outbox@127.0.0.1:5432/outbox"

DATABASES = {
    "default": env.db("DATABASE_URL", default=DEFAULT_DATABASE_URL),
}
# Persistent connections: the relay and the consumers run short transactions in a loop.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# No JIT compilation: the console's queries (a delivery status from per-row subqueries over
# every partition) are costed past PostgreSQL's JIT threshold, and compiling them takes longer
# than running them (EXPLAIN ANALYZE on bench-console's 1M events shows it). Nothing of this
# project runs the long analytical queries JIT is for: the analytics job reads through Spark's
# own connections.
DATABASE_OPTIONS = {"options": "-c jit=off"}
DATABASES["default"]["OPTIONS"] = {**DATABASE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
