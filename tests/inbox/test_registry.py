"""inbox/registry.py"""

import functools
import importlib
import sys

import pytest

from inbox import handler
from inbox.errors import DuplicateHandler
from inbox.registry import HandlerRegistry, get_registry, scoped_registry


def test_handlers_register_by_group_and_event_type(inbox_registry):
    @handler(event_type="PaymentCompleted", topic="outbox.event.payment", group="delivery")
    def ship(message):
        pass

    @handler(event_type="PaymentCompleted", topic="outbox.event.payment", group="billing")
    def bill(message):
        pass

    @handler(event_type="OrderPlaced", topic="outbox.event.order", group="delivery")
    def prepare(message):
        pass

    found = inbox_registry.get(group="delivery", event_type="PaymentCompleted")
    assert found is not None
    assert found.function is ship
    assert inbox_registry.get(group="delivery", event_type="Unknown") is None
    assert inbox_registry.groups() == ["billing", "delivery"]
    assert inbox_registry.topics("delivery") == ["outbox.event.order", "outbox.event.payment"]
    assert set(inbox_registry.for_group("delivery")) == {"PaymentCompleted", "OrderPlaced"}


def test_two_handlers_for_one_group_and_event_type_are_an_error(inbox_registry):
    @handler(event_type="PaymentCompleted", topic="payments", group="delivery")
    def first(message):
        pass

    with pytest.raises(DuplicateHandler, match="two handlers for 'PaymentCompleted'") as error:

        @handler(event_type="PaymentCompleted", topic="payments", group="delivery")
        def second(message):
            pass

    assert error.value.code == "duplicate_handler"


def test_the_same_function_registered_again_is_not_a_duplicate(inbox_registry):
    def ship(message):
        pass

    handler(event_type="E", topic="t", group="g")(ship)
    handler(event_type="E", topic="t", group="g")(ship)  # a module imported twice
    assert len(inbox_registry) == 1


def test_a_scoped_registry_does_not_leak():
    outer = get_registry()
    with scoped_registry() as inner:

        @handler(event_type="E", topic="t", group="scoped-only")
        def noop(message):
            pass

        assert get_registry() is inner
        assert inner.groups() == ["scoped-only"]
    assert get_registry() is outer
    assert "scoped-only" not in outer.groups()


def test_a_given_registry_can_be_scoped():
    registry = HandlerRegistry()
    with scoped_registry(registry) as active:
        assert active is registry


def test_a_function_defined_twice_under_one_name_is_a_duplicate(inbox_registry):
    @handler(event_type="E", topic="t", group="g")
    def ship(message):
        pass

    with pytest.raises(DuplicateHandler, match=r"test_registry\.py:\d+\) and .*test_registry"):

        @handler(event_type="E", topic="t", group="g")
        def ship(message):
            pass


def test_two_lambdas_are_a_duplicate(inbox_registry):
    handler(event_type="E", topic="t", group="g")(lambda message: None)
    with pytest.raises(DuplicateHandler):
        handler(event_type="E", topic="t", group="g")(lambda message: None)


def test_two_handlers_behind_one_decorator_are_a_duplicate(inbox_registry):
    def logged(function):
        @functools.wraps(function)
        def wrapper(message):
            return function(message)

        return wrapper

    @handler(event_type="E", topic="t", group="g")
    @logged
    def ship(message):
        pass

    with pytest.raises(DuplicateHandler):

        @handler(event_type="E", topic="t", group="g")
        @logged
        def ship(message):
            pass


def test_a_module_imported_again_is_not_a_duplicate(inbox_registry, tmp_path, monkeypatch):
    (tmp_path / "reloaded_handlers.py").write_text(
        "from inbox import handler\n\n\n"
        '@handler(event_type="E", topic="t", group="g")\n'
        "def ship(message):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module("reloaded_handlers")
        first = module.ship
        importlib.reload(module)
    finally:
        sys.modules.pop("reloaded_handlers", None)
    assert len(inbox_registry) == 1
    entry = inbox_registry.get(group="g", event_type="E")
    assert entry is not None
    assert entry.function is module.ship
    assert entry.function is not first
