"""Settings for pytest: the same real PostgreSQL, Kafka and Redis as development."""

from project.settings.environment import env
from project.settings.local import *  # noqa: F403

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests call services directly; a task sent by code under test runs in the test's process
# so that a test never depends on a worker being up.
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True

# Test runs can share one PostgreSQL server: each names its own test database.
DATABASES["default"]["TEST"] = {"NAME": env("TEST_DATABASE_NAME", default="test_outbox")}  # noqa: F405
# Tests run the relay themselves; a commit does not start one behind their back.
OUTBOX = {**OUTBOX, "NUDGE_ON_COMMIT": False}  # noqa: F405
# Static files come from the apps' folders in tests: no collectstatic run is needed.
WHITENOISE_AUTOREFRESH = True
WHITENOISE_USE_FINDERS = True
