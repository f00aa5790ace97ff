from django.apps import AppConfig


class OutboxConfig(AppConfig):
    # Its migrations were made with 64-bit ids, whatever the project's DEFAULT_AUTO_FIELD.
    default_auto_field = "django.db.models.BigAutoField"
    name = "outbox"
    verbose_name = "Outbox"

    def ready(self) -> None:
        from outbox import checks  # noqa: F401  registers the system checks
