"""Settings for pytest: the same real PostgreSQL, Kafka and Redis as development."""

from project.settings.local import *  # noqa: F403

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests call services directly; a task sent by code under test runs in the test's process
# so that a test never depends on a worker being up.
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
