"""Settings of the outbox, the inbox and their Kafka connection, as Django REST framework keeps
its own: one dict per app in the project's settings (KAFKA_EVENTS, OUTBOX, INBOX), read through
one object that answers each key with the project's value or its documented default.

    from kafka_events.conf import kafka_settings
    kafka_settings.BOOTSTRAP_SERVERS

An object reads the dict once per key and keeps the value; Django's `setting_changed` signal
(override_settings, pytest-django's `settings` fixture) makes it read again. Deleting the
setting in a test (`del settings.OUTBOX`) sends no signal: set it to `{}` for the defaults.
Each object's `check()` is a system check of the dict's shape: unknown keys, wrong types.
"""

import difflib
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.signals import setting_changed

# What a value of each type is called in a check's message.
TYPE_NAMES = {
    bool: "True or False",
    int: "an integer",
    float: "a number",
    str: "a string",
    dict: "a dict",
    list: "a list",
}


def _has_type(value: Any, expected: type) -> bool:
    # True is an int to Python, never a number of anything here; an int is a float's value.
    if expected is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if expected is float:
        return isinstance(value, int | float)
    if expected is list:
        return isinstance(value, list | tuple)
    return isinstance(value, expected)


class AppSettings:
    """The settings dict `setting_name` of one app, with a default for every key.

    `defaults` names every key (a key it lacks is an error of the check, and an AttributeError
    to read). A default of None needs the type of the other values the key takes, in `types`.
    `derived` computes a key's value from the others when the project leaves it unset (or
    None), e.g. {"BATCH_MAX_SECONDS": lambda s: s.MAX_POLL_INTERVAL_MS / 1000 / 3}.
    `check_id` prefixes the ids of the check's errors (outbox: outbox.E010...); `label` is
    what the messages call the app ("the outbox").
    """

    def __init__(
        self,
        setting_name: str,
        defaults: Mapping[str, Any],
        *,
        check_id: str,
        label: str,
        types: Mapping[str, type] | None = None,
        derived: Mapping[str, Callable[["AppSettings"], Any]] | None = None,
    ) -> None:
        self.setting_name = setting_name
        self.defaults = dict(defaults)
        self.check_id = check_id
        self.label = label
        self.types = {key: type(value) for key, value in self.defaults.items()} | dict(types or {})
        self.derived = dict(derived or {})
        untyped = sorted(key for key, kind in self.types.items() if kind is type(None))
        unknown = sorted((set(self.types) | set(self.derived)) - set(self.defaults))
        if untyped or unknown:
            raise ValueError(
                f"{setting_name}: give the type of {untyped} in types; {unknown} are not in "
                "defaults."
            )
        self._cached: set[str] = set()
        setting_changed.connect(self._setting_changed)

    def __getattr__(self, key: str) -> Any:
        # Only for a key not read yet: a value read is an attribute of the object until reload.
        if key.startswith("_") or key not in self.__dict__.get("defaults", ()):
            raise AttributeError(f"{key!r} is not a setting of {self.label} ({self.setting_name})")
        value = self.user_settings().get(key, self.defaults[key])
        if value is None and key in self.derived:
            value = self.derived[key](self)
        self._cached.add(key)
        setattr(self, key, value)
        return value

    def user_settings(self) -> Mapping[str, Any]:
        """The project's dict, {} when the project has none."""
        value = getattr(settings, self.setting_name, {})
        return value if isinstance(value, Mapping) else {}

    def reload(self) -> None:
        """Forgets the values read, so that the next read sees the settings as they are."""
        for key in list(self._cached):
            self.__dict__.pop(key, None)
        self._cached.clear()

    def _setting_changed(self, *, setting: str, **kwargs: Any) -> None:
        if setting == self.setting_name:
            self.reload()

    def name(self, key: str) -> str:
        """How messages name a key: OUTBOX["BATCH_SIZE"]."""
        return f'{self.setting_name}["{key}"]'

    def check(self) -> list[CheckMessage]:
        """Errors of the project's dict: not a dict (E012), an unknown key (E010), a value of
        the wrong type (E011). Each names the key."""
        value = getattr(settings, self.setting_name, {})
        if not isinstance(value, Mapping):
            return [
                Error(
                    f"{self.setting_name} must be a dict of settings; got {type(value).__name__}.",
                    hint=f"Its keys and their defaults: {', '.join(self.defaults)}.",
                    id=f"{self.check_id}.E012",
                )
            ]
        errors: list[CheckMessage] = []
        for key, given in value.items():
            if key not in self.defaults:
                errors.append(self._unknown_key_error(key))
                continue
            expected = self.types[key]
            nullable = self.defaults[key] is None
            if not (nullable and given is None) and not _has_type(given, expected):
                nothing = " or None" if nullable else ""
                errors.append(
                    Error(
                        f"{self.name(key)}: must be {TYPE_NAMES.get(expected, expected.__name__)}"
                        f"{nothing}; got {given!r} ({type(given).__name__}).",
                        id=f"{self.check_id}.E011",
                    )
                )
        return errors

    def _unknown_key_error(self, key: object) -> Error:
        message = f"{self.name(str(key))}: not a setting of {self.label}"
        close = difflib.get_close_matches(str(key), self.defaults, n=1)
        if close:
            message += f'; did you mean "{close[0]}"?'
        else:
            message += "."
        return Error(
            message,
            hint=f"The settings of {self.label}: {', '.join(self.defaults)}.",
            id=f"{self.check_id}.E010",
        )


DEFAULTS: dict[str, Any] = {
    # Comma-separated host:port list, as librdkafka's bootstrap.servers expects.
    "BOOTSTRAP_SERVERS": "127.0.0.1:9092",
    # Extra librdkafka properties for every client, producer, consumers and admin clients
    # alike (e.g. security.protocol, sasl.*): {"security.protocol": "SASL_SSL", ...}.
    "CLIENT_CONFIG": {},
}

kafka_settings = AppSettings(
    "KAFKA_EVENTS", DEFAULTS, check_id="kafka_events", label="the Kafka connection"
)


def check_kafka_events_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The system check of KAFKA_EVENTS; the outbox and the inbox both register it (Django
    keeps a check registered twice once)."""
    return kafka_settings.check()
