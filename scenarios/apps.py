from django.apps import AppConfig


class ScenariosConfig(AppConfig):
    name = "scenarios"
    verbose_name = "Scenarios: fault injection and the delivery checker"
    default_auto_field = "django.db.models.BigAutoField"
