"""Fixtures of the console's tests: users with and without each permission, and outbox and
inbox rows in any state, written through the services or as the relay would leave them."""

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.db import transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

import outbox
from inbox.models import InboxMessage
from outbox.ids import time_ordered_event_id
from outbox.models import OutboxDelivery, OutboxEvent, OutboxHeldEvent
from outbox.services.event_log.held import OPERATOR_RELAY
from outbox.services.event_log.shards import shard_of
from tests.conftest import event_row_place

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
    "inbox.retry_inboxsequence",
    "inbox.skip_inboxsequencehead",
    "inbox.release_inboxkey",
)
PAYLOAD_PERMISSION = "console.view_payload"
# The relay named on the delivery records the fixtures write.
RELAY = "relay-1"


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
def payload_viewer(make_user: Callable[..., User]) -> User:
    """A viewer who may also see payloads and headers (console/privacy.py)."""
    return make_user(*VIEW_PERMISSIONS, PAYLOAD_PERMISSION, username="payload-viewer")


@pytest.fixture
def operator(make_user: Callable[..., User]) -> User:
    return make_user(
        *VIEW_PERMISSIONS, *ACTION_PERMISSIONS, PAYLOAD_PERMISSION, username="operator"
    )


@pytest.fixture
def api(db: Any) -> APIClient:
    return APIClient()


def detail_pages(user: User, event: OutboxEvent, message: InboxMessage) -> list[str]:
    """The admin's detail pages of `event` and of `message`, as `user` sees them."""
    client = Client()
    client.force_login(user)
    pages = []
    for url in (
        f"/admin/outbox/outboxevent/{event.pk}/change/",
        f"/admin/inbox/inboxmessage/{message.pk}/change/",
    ):
        response = client.get(url)
        assert response.status_code == 200
        pages.append(response.content.decode())
    return pages


def logged_in(user: User) -> Client:
    """A Django test client with `user`'s admin session."""
    client = Client()
    client.force_login(user)
    return client


def attempt_rows(html: str) -> list[dict[str, str]]:
    """The rows of the attempt history table on a detail page, each by its column's heading."""
    table = html[html.index("console-attempts") :]
    table = table[: table.index("</table>")]
    headings = re.findall(r"<th[^>]*>(.*?)</th>", table, re.S)
    return [
        dict(zip(headings, re.findall(r"<td[^>]*>(.*?)</td>", row, re.S), strict=True))
        for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)
        if "<td" in row
    ]


def client_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def hold(
    event: OutboxEvent, *, attempts: int = 0, next_attempt_at: Any = None, error: str = ""
) -> OutboxHeldEvent:
    """Holds `event` as the relay does: a failed head with its attempts, or (no attempts) an
    event queued behind its key's head, at the place of its own row."""
    row = event_row_place(event)
    return OutboxHeldEvent.objects.create(
        event_id=event.pk,
        shard=shard_of(event.key),
        topic=event.topic,
        key=event.key,
        transaction_id=row["event_transaction_id"],
        position=row["event_position"],
        **row,
        attempts=attempts,
        next_attempt_at=next_attempt_at,
        last_error=error,
    )


def deliver(event: OutboxEvent, outcome: str, **fields: Any) -> OutboxDelivery:
    """A delivery record of `event`, as the relay (or an operator's discard) writes it."""
    fields.setdefault("published_at", timezone.now())
    fields.setdefault("relay", RELAY)
    return OutboxDelivery.objects.create(event_id=event.pk, outcome=outcome, **fields)


@pytest.fixture
def make_event(db: Any) -> Callable[..., OutboxEvent]:
    """An outbox event published through outbox.publish, then put in `status` as the relay
    leaves it, in its delivery records and held set (the row is never changed):
    - PENDING: not read by the relay yet (hold() queues it behind its key's head); with
      `attempts`, a head backing off after that many failed tries;
    - FAILED: a head whose `attempts` (10) are spent, waiting for an operator; with
      `discarded_at`, discarded by an operator then;
    - DONE: published (after `attempts` - 1 failed tries) at `published_at`, to
      `kafka_partition` 0, `kafka_offset` 41."""

    def make(
        status: str = OutboxEvent.Status.PENDING,
        *,
        topic: str = "console.orders",
        key: str | None = None,
        event_type: str = "OrderPlaced",
        aggregate_type: str = "order",
        error: str = "MSG_TIMED_OUT: Local: Message timed out",
        attempts: int | None = None,
        published_at: datetime | None = None,
        kafka_partition: int = 0,
        kafka_offset: int = 41,
        discarded_at: datetime | None = None,
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
        # A delivery record is never dated before its event (record_time): an event published
        # or discarded in the past was created before then.
        # Its id, drawn with its creation time, moves with it (outbox.ids.drawn_time_range).
        recorded = [moment for moment in (published_at, discarded_at) if moment is not None]
        if recorded and min(recorded) < event.created_at:
            created_at = min(recorded) - timedelta(seconds=1)
            backdated_id = time_ordered_event_id(created_at)
            OutboxEvent.objects.filter(pk=event.pk).update(id=backdated_id, created_at=created_at)
            event = OutboxEvent.objects.get(pk=backdated_id)
        event.refresh_from_db()
        Status = OutboxEvent.Status
        default_attempts = {Status.FAILED.value: 10, Status.DONE.value: 1}.get(status, 0)
        tries = default_attempts if attempts is None else attempts
        failures = tries - 1 if status == Status.DONE else tries
        for _ in range(failures):
            deliver(event, "FAILED", error=error)
        if status == Status.DONE:
            deliver(
                event,
                "PUBLISHED",
                published_at=published_at or timezone.now(),
                kafka_partition=kafka_partition,
                kafka_offset=kafka_offset,
            )
        elif status == Status.FAILED and discarded_at is not None:
            deliver(event, "DISCARDED", published_at=discarded_at, relay=OPERATOR_RELAY)
        elif status == Status.FAILED:
            hold(event, attempts=tries, error=error)
        elif tries:
            backoff_ends = timezone.now() + timedelta(minutes=5)
            hold(event, attempts=tries, next_attempt_at=backoff_ends, error=error)
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


TOO_LARGE = "MSG_SIZE_TOO_LARGE: Broker: Message size too large"
TIMED_OUT = "MSG_TIMED_OUT: Local: Message timed out"


@pytest.fixture
def failed_events(make_event):
    def failed(topic: str, error: str, count: int) -> list[OutboxEvent]:
        return [
            make_event(OutboxEvent.Status.FAILED, topic=topic, error=error) for _ in range(count)
        ]

    return {
        "large_a": failed("orders.a", TOO_LARGE, 3),
        "large_b": failed("orders.b", TOO_LARGE, 2),
        "timeout_a": failed("orders.a", TIMED_OUT, 1),
    }
