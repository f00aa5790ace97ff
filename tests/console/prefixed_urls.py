"""A project that mounts the console's API, metrics and health under a prefix of its own
("ops/"), beside Django's default admin site, with the console's 404 handler."""

from django.contrib import admin
from django.urls import include, path

from console.health import health_view
from console.metrics import metrics_view

handler404 = "console.api.stats.not_found"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/api/", include("console.api.urls")),
    path("ops/metrics", metrics_view, name="metrics"),
    path("ops/health/", health_view, name="health"),
]
