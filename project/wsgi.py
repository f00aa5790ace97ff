import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")

application = get_wsgi_application()

from project.tracing import configure_tracing  # noqa: E402  (needs the settings loaded)

configure_tracing(service_name="web")
