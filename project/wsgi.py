import gc
import os

import django
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")
django.setup(set_prefix=False)

from kafka_events.tracing import configure_tracing  # noqa: E402  (needs the settings loaded)

# Before the application loads its middleware: Django's instrumentation adds its own.
configure_tracing(service_name="web")
application = get_wsgi_application()
# What is loaded by now (modules, settings, the URL and middleware set-up) lives as long as
# the process: frozen out of the collector's reach, a full collection scans only what requests
# left behind, and no longer stalls a request for the time of a walk over every object.
gc.freeze()
