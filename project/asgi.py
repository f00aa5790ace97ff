import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.local")

application = get_asgi_application()

from project.tracing import configure_tracing  # noqa: E402  (needs the settings loaded)

configure_tracing(service_name="web")
