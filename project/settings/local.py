"""Developer settings: the defaults work with `make services-up` and no `.env`."""

from project.settings.base import *  # noqa: F403
from project.settings.environment import env

DEBUG = env.bool("DEBUG", default=True)
# runserver serves static files itself in development; the manifest is a deployment step.
STORAGES["staticfiles"] = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}  # noqa: F405
# The fault-injection scenarios and the delivery checker (docs/scenarios.md); not in production.
INSTALLED_APPS = [*INSTALLED_APPS, "scenarios"]  # noqa: F405
