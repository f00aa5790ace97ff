import gc
import os

import django
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")
django.setup(set_prefix=False)

from kafka_events.tracing import configure_tracing  # noqa: E402  (needs the settings loaded)

# Before the application loads its middleware: Django's instrumentation adds its own.
configure_tracing(service_name="web")
application = get_asgi_application()
# As project/wsgi.py does, and for the same reason.
gc.freeze()
