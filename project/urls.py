from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from console.health import health_view
from console.metrics import metrics_view

handler404 = "console.api.stats.not_found"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:index", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/", include("console.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("health/", health_view, name="health"),
]

if settings.DEMO_ENABLED:
    # The payments service's endpoint (demo/views.py): installed only with the demo.
    urlpatterns.append(path("demo/", include("demo.urls")))
