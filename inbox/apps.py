from django.apps import AppConfig


class InboxConfig(AppConfig):
    # Its migrations were made with 64-bit ids, whatever the project's DEFAULT_AUTO_FIELD.
    default_auto_field = "django.db.models.BigAutoField"
    name = "inbox"
    verbose_name = "Inbox"

    def ready(self) -> None:
        from inbox import checks  # noqa: F401  registers the system checks
        from inbox.registry import autodiscover

        # Importing every app's handlers.py here makes two handlers for one (group, event
        # type) fail at start-up, in every process: consumers, Celery workers, the web.
        autodiscover()
