"""Fixtures of the console's tests: users with and without each permission, and outbox and
inbox rows in any state, written through the services or as the relay would leave them."""

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

import outbox
from inbox.models import InboxMessage
from outbox.models import OutboxEvent

VIEW_PERMISSIONS = (
    "outbox.view_outboxevent",
    "inbox.view_inboxmessage",
    "console.view_operatoraction",
)
ACTION_PERMISSIONS = (
    "outbox.retry_outboxevent",
    "outbox.discard_outboxevent",
    "outbox.replay_outboxevent",
    "outbox.release_outboxkey",
    "inbox.retry_inboxmessage",
    "inbox.replay_inboxmessage",
    "inbox.discard_inboxmessage",
)


@pytest.fixture(autouse=True)
def _fresh_throttles() -> Iterator[None]:
    # Throttle counters live in the cache; each test starts with none.
    cache.clear()
    yield
    cache.clear()


def _permission(name: str) -> Permission:
    app_label, codename = name.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


@pytest.fixture
def make_user(db: Any) -> Callable[..., User]:
    def make(*permissions: str, username: str | None = None) -> User:
        user = User.objects.create_user(
            username=username or f"user-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True
        )
        user.user_permissions.set([_permission(name) for name in permissions])
        return User.objects.get(pk=user.pk)  # a fresh permission cache

    return make


@pytest.fixture
def viewer(make_user: Callable[..., User]) -> User:
    return make_user(*VIEW_PERMISSIONS, username="viewer")


@pytest.fixture
def operator(make_user: Callable[..., User]) -> User:
    return make_user(*VIEW_PERMISSIONS, *ACTION_PERMISSIONS, username="operator")


@pytest.fixture
def api(db: Any) -> APIClient:
    return APIClient()


def client_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def make_event(db: Any) -> Callable[..., OutboxEvent]:
    """An outbox event published through outbox.publish, then put in `status` as the relay
    would leave it."""

    def make(
        status: str = OutboxEvent.Status.PENDING,
        *,
        topic: str = "console.orders",
        key: str | None = None,
        event_type: str = "OrderPlaced",
        aggregate_type: str = "order",
        error: str = "MSG_TIMED_OUT: Local: Message timed out",
        **fields: Any,
    ) -> OutboxEvent:
        aggregate_id = key or f"order-{uuid.uuid4().hex[:8]}"
        with transaction.atomic():
            event = outbox.publish(
                aggregate_type=aggregate_type,
                aggregate_id=aggregate_id,
                event_type=event_type,
                payload={"order": aggregate_id, "amount": "12.50"},
                topic=topic,
                headers={"tenant": "acme"},
            )
        updates: dict[str, Any] = {"status": status, **fields}
        if status == OutboxEvent.Status.FAILED:
            updates.setdefault("attempts", 10)
            updates.setdefault("last_error", error)
        if status == OutboxEvent.Status.DONE:
            updates.setdefault("attempts", 1)
            updates.setdefault("published_at", timezone.now())
            updates.setdefault("kafka_partition", 0)
            updates.setdefault("kafka_offset", 41)
        OutboxEvent.objects.filter(pk=event.pk).update(**updates)
        event.refresh_from_db()
        return event

    return make


@pytest.fixture
def make_message(db: Any) -> Callable[..., InboxMessage]:
    counter = iter(range(1, 1_000_000))

    def make(
        status: str = InboxMessage.Status.DONE,
        *,
        event_id: str | None = None,
        group: str = "billing",
        **fields: Any,
    ) -> InboxMessage:
        now = timezone.now()
        values: dict[str, Any] = {
            "event_id": event_id or str(uuid.uuid4()),
            "consumer_group": group,
            "topic": "console.orders",
            "partition": 0,
            "offset": next(counter),
            "key": "order-1",
            "event_type": "OrderPlaced",
            "aggregate_type": "order",
            "aggregate_id": "order-1",
            "payload": {"order": "order-1"},
            "headers": {"event_id": "x"},
            "status": status,
            "attempts": 1,
            "received_at": now,
            "processed_at": now if status == InboxMessage.Status.DONE else None,
        }
        if status == InboxMessage.Status.FAILED:
            values["attempts"] = 8
            values["last_error"] = "demo.errors.DemoFailure: injected\n  File ..."
        values.update(fields)
        return InboxMessage.objects.create(**values)

    return make
