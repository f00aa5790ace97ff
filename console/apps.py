from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    # Its migrations were made with 64-bit ids, whatever the project's DEFAULT_AUTO_FIELD.
    default_auto_field = "django.db.models.BigAutoField"
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from console import checks  # noqa: F401  registers the system checks
