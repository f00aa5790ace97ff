"""override_settings for the keys of an app's settings dict (kafka_events/conf.py)."""

from typing import Any

from django.conf import settings
from django.test import override_settings


class override_app_settings(override_settings):
    """Sets keys of the dict `setting_name` and keeps its other keys, as a decorator or a
    context manager: `@override_app_settings("INBOX", MAX_ATTEMPTS=1)`. The dict is read when
    the override starts, so that it adds to the settings of that moment."""

    def __init__(self, setting_name: str, **values: Any) -> None:
        super().__init__()
        self.setting_name = setting_name
        self.values = values

    def enable(self) -> None:
        current = getattr(settings, self.setting_name, {})
        self.options = {self.setting_name: {**current, **self.values}}
        super().enable()
