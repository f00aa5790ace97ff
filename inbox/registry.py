"""Handlers by (consumer group, event type).

`@handler(...)` registers into the active registry. Handlers are found in the `handlers.py`
module of every installed app (`autodiscover()`, run by InboxConfig.ready). Tests swap the
active registry with `scoped_registry()` so that their handlers never leak into other tests.
"""

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from django.utils.module_loading import autodiscover_modules

from inbox.errors import DuplicateHandler

if TYPE_CHECKING:
    from inbox.models import InboxMessage

HandlerFunction: TypeAlias = "Callable[[InboxMessage], None]"


@dataclass(frozen=True)
class Handler:
    group: str
    event_type: str
    topic: str
    function: HandlerFunction

    @property
    def name(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"


def _definition(function: HandlerFunction) -> tuple[str, str, str, int] | None:
    """Where `function` was written: module, qualified name, file and first line of its
    code (of the innermost function, past functools.wraps decorators)."""
    inner = inspect.unwrap(function)
    code = getattr(inner, "__code__", None)
    if code is None:
        return None
    return (
        getattr(inner, "__module__", ""),
        getattr(inner, "__qualname__", ""),
        code.co_filename,
        code.co_firstlineno,
    )


def _describe(function: HandlerFunction) -> str:
    where = _definition(function)
    if where is None:
        return repr(function)
    module, qualname, filename, line = where
    return f"{module}.{qualname} ({filename}:{line})"


def _same_definition(first: HandlerFunction, second: HandlerFunction) -> bool:
    if first is second:
        return True
    where = _definition(first)
    return where is not None and where == _definition(second)


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str], Handler] = {}

    def register(self, entry: Handler) -> None:
        existing = self._handlers.get((entry.group, entry.event_type))
        # A module imported again (importlib.reload, say) registers the same definition
        # again: tolerated, the newer function kept. Two definitions with one name (a
        # function defined twice in a module, two lambdas) are two handlers.
        if existing is not None and not _same_definition(existing.function, entry.function):
            raise DuplicateHandler(
                f"Group {entry.group!r} has two handlers for {entry.event_type!r}: "
                f"{_describe(existing.function)} and {_describe(entry.function)}. Keep one, "
                "or give one another group."
            )
        self._handlers[(entry.group, entry.event_type)] = entry

    def get(self, *, group: str, event_type: str) -> Handler | None:
        return self._handlers.get((group, event_type))

    def for_group(self, group: str) -> dict[str, Handler]:
        return {h.event_type: h for (g, _), h in self._handlers.items() if g == group}

    def groups(self) -> list[str]:
        return sorted({group for group, _ in self._handlers})

    def topics(self, group: str) -> list[str]:
        return sorted({h.topic for h in self.for_group(group).values()})

    def __len__(self) -> int:
        return len(self._handlers)


_active = HandlerRegistry()


def get_registry() -> HandlerRegistry:
    return _active


@contextmanager
def scoped_registry(registry: HandlerRegistry | None = None) -> Iterator[HandlerRegistry]:
    """Makes `registry` (a new empty one by default) the active registry inside the block."""
    global _active
    previous = _active
    _active = registry if registry is not None else HandlerRegistry()
    try:
        yield _active
    finally:
        _active = previous


def handler(
    *, event_type: str, topic: str, group: str
) -> Callable[[HandlerFunction], HandlerFunction]:
    """Registers `fn(message: InboxMessage) -> None` for `event_type` on `topic` in `group`.

    The function runs inside the database transaction that records the message, in a
    savepoint of its own: its database writes commit with the inbox row or not at all.
    """

    def register(function: HandlerFunction) -> HandlerFunction:
        get_registry().register(
            Handler(group=group, event_type=event_type, topic=topic, function=function)
        )
        return function

    return register


def autodiscover() -> None:
    autodiscover_modules("handlers")
