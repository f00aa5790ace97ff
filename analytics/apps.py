from django.apps import AppConfig


class AnalyticsConfig(AppConfig):
    # Its migrations were made with 64-bit ids, whatever the project's DEFAULT_AUTO_FIELD.
    default_auto_field = "django.db.models.BigAutoField"
    name = "analytics"
    verbose_name = "Analytics"
