"""The API keeps the contract its OpenAPI schema states, under fuzzing.

schemathesis reads the live schema (/api/schema/, from the app itself) and, for every
operation, sends the examples it derives from the schema, valid and invalid (wrong types, out
of range values, unknown parameters, bodies that break the rules), to the WSGI app in this
process: the real PostgreSQL holds events, messages and analytics results in every state so
that details and actions reach rows, and the consumer-lag endpoint asks the real Kafka. The
caller is a superuser with an API token allowed every action. Each answer must be no 5xx, a
status code and a content type the operation documents, and a body that matches the
documented schema of that status (the Error component for every 4xx). After the examples,
each operation must have answered at least one of them with a success (2xx): a token or a
permission refused everywhere would otherwise pass, every 401 and 403 being documented.

The examples are derandomized and bounded per operation, so a run is repeatable and takes
about a minute.
"""

import base64
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, cast

import hypothesis
import jsonschema  # type: ignore[import-untyped]
import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.handlers.wsgi import WSGIHandler
from django.core.serializers.json import DjangoJSONEncoder
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.db.models import Model
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from hypothesis import strategies as st
from rest_framework.test import APIClient
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from console.bulk_operations import bulk_action_run
from console.models import ApiToken, OperatorAction
from console.tokens import api_token_create
from inbox.models import InboxMessage
from outbox.models import OutboxEvent
from tests.analytics.results import result_run

pytestmark = [pytest.mark.django_db, pytest.mark.kafka]

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Examples per operation: enough for the generator to reach each parameter's edge values
# (out of range dates, offsets, huge integers, unknown fields) in a run of about a minute.
# API_CONTRACT_EXAMPLES=500 runs a deeper search.
MAX_EXAMPLES = int(os.environ.get("API_CONTRACT_EXAMPLES", "60"))
# Any host the app accepts (ALLOWED_HOSTS of the test settings).
HOST = "localhost"

Status = OutboxEvent.Status


# A key held in the group "billing", which keeps order per key: a FAILED head, one parked.
HELD_KEY = {"consumer_group": "billing", "topic": "console.orders", "key": "order-1"}
# A failure group of each side among the rows below (their fixtures' errors and topic).
FAILURE_GROUPS = {
    "/api/outbox/failure-groups/": {"error_class": "MSG_TIMED_OUT", "topic": "console.orders"},
    "/api/inbox/failure-groups/": {
        "error_class": "demo.errors.DemoFailure",
        "topic": "console.orders",
        "consumer_group": "audit",
    },
}


def _ids(model: type[Model], run: AnalyticsRun) -> list[str]:
    return [
        str(pk) for pk in model._default_manager.filter(run=run).values_list("pk", flat=True)[:3]
    ]


def _bulk_operations(events: list[OutboxEvent], settings: Any) -> list[str]:
    """A bulk operation queued (two chunks) and one done in its request, over `events` (two
    PENDING, then a FAILED one it discards)."""
    operator = User.objects.create_superuser(username="bulk-operator", password="pw")
    chunk_size = settings.CONSOLE_BULK_CHUNK_SIZE
    settings.CONSOLE_BULK_CHUNK_SIZE = 1
    try:
        queued = bulk_action_run(
            user=operator,
            action=OperatorAction.Action.OUTBOX_RETRY,
            source="api",
            reason="contract",
            ids=[event.pk for event in events[:2]],
        )
    finally:
        settings.CONSOLE_BULK_CHUNK_SIZE = chunk_size
    done = bulk_action_run(
        user=operator,
        action=OperatorAction.Action.OUTBOX_DISCARD,
        source="api",
        reason="contract",
        ids=[events[2].pk],
    )
    return [str(queued.bulk_operation.pk), str(done.bulk_operation.pk)]


@pytest.fixture
def rows(
    make_event: Callable[..., OutboxEvent],
    make_message: Callable[..., InboxMessage],
    settings: Any,
) -> dict[str, list[str]]:
    """Rows in every state the actions treat apart, and the ids the fuzzer may name, by the
    path prefix of the operations that take them."""
    settings.INBOX = {
        **settings.INBOX,
        "ORDERING": "none",
        "GROUP_ORDERING": {HELD_KEY["consumer_group"]: "key"},
    }
    events = [
        make_event(Status.PENDING),
        make_event(Status.PENDING, attempts=2),
        make_event(Status.FAILED),
        make_event(Status.FAILED, discarded_at=timezone.now()),
        make_event(Status.DONE),
    ]
    messages = [
        make_message(InboxMessage.Status.FAILED, key=HELD_KEY["key"]),
        make_message(InboxMessage.Status.PARKED, key=HELD_KEY["key"], attempts=0),
        make_message(InboxMessage.Status.DONE, group="audit"),
        make_message(InboxMessage.Status.FAILED, group="audit"),
        make_message(InboxMessage.Status.PENDING, group="audit"),
    ]
    run = result_run()
    # Events of their own: the bulk discard would leave no FAILED event for the event's
    # discard and the outbox failure group's actions to succeed on.
    bulk_events = [
        make_event(Status.PENDING),
        make_event(Status.PENDING),
        make_event(Status.FAILED),
    ]
    return {
        "/api/bulk-operations/": _bulk_operations(bulk_events, settings),
        "/api/outbox/events/": [str(event.pk) for event in events],
        "/api/inbox/messages/": [str(message.pk) for message in messages],
        "/api/analytics/runs/": [str(run.pk)],
        "/api/analytics/lag-stats/": _ids(DeliveryLagStat, run),
        "/api/analytics/duplicate-stats/": _ids(DuplicateStat, run),
        "/api/analytics/relay-stats/": _ids(RelayStat, run),
        "/api/analytics/findings/": _ids(ReconciliationFinding, run),
    }


@pytest.fixture
def token(db: Any) -> str:
    admin = User.objects.create_superuser(username="contract", password="pw")
    _, plain = api_token_create(
        user=admin,
        created_by=admin,
        name="contract",
        expires_in=timedelta(days=1),
        actions=[ApiToken.ALL_ACTIONS],
    )
    return plain


@pytest.fixture
def app() -> Iterator[WSGIHandler]:
    """Django's WSGI app, keeping the test's database connection (and its transaction) open
    between requests, as Django's test client does."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def answers() -> Iterator[list[int]]:
    """The status codes of one operation's answers; once its examples have run, at least one
    must be a success, or the run proved nothing of the operation's documented answers."""
    statuses: list[int] = []
    yield statuses
    assert any(200 <= status < 300 for status in statuses), (
        f"no successful answer among {sorted(Counter(statuses).items())}"
    )


def _served_schema() -> dict[str, Any]:
    """The schema /api/schema/ serves, built by the same generator as its view (collection
    runs before any database exists; test_the_fuzzed_schema_is_the_served_one checks that
    the view serves this very document)."""
    generated = SchemaGenerator().get_schema(request=None, public=True)
    # As JSON, like the view's answer.
    return cast(dict[str, Any], json.loads(json.dumps(generated, cls=DjangoJSONEncoder)))


SERVED_SCHEMA = _served_schema()
schema = schemathesis.openapi.from_dict(
    SERVED_SCHEMA,
    config=schemathesis.Config.from_dict(
        {"generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"}}
    ),
)


def test_the_fuzzed_schema_is_the_served_one(token: str) -> None:
    client = APIClient()
    response = client.get("/api/schema/", {"format": "json"}, HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 200
    assert json.loads(response.content) == SERVED_SCHEMA


@schema.parametrize()
@schema.given(data=st.data())
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    # The rows and the token are made once per operation, not per example.
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
    ],
)
def test_every_operation_keeps_its_documented_contract(
    case: Case,
    data: st.DataObject,
    app: WSGIHandler,
    rows: dict[str, list[str]],
    token: str,
    answers: list[int],
) -> None:
    # Half the time, details and actions name a row that exists (in one of its states), the
    # held keys' actions the held key and the failure groups' actions a group; the other half,
    # what the generator made.
    known = next((ids for prefix, ids in rows.items() if case.path.startswith(prefix)), [])
    if "id" in (case.path_parameters or {}) and known and data.draw(st.booleans(), "a known id"):
        case.path_parameters = {**case.path_parameters, "id": data.draw(st.sampled_from(known))}
    held_key_action = case.path.startswith("/api/inbox/held-keys/") and case.method == "POST"
    if held_key_action and isinstance(case.body, dict) and data.draw(st.booleans(), "held key"):
        case.body = {**case.body, **HELD_KEY}
    group = next((g for prefix, g in FAILURE_GROUPS.items() if case.path.startswith(prefix)), {})
    group_action = bool(group) and case.method == "POST"
    if group_action and isinstance(case.body, dict) and data.draw(st.booleans(), "failure group"):
        case.body = {**case.body, **group}
    # Throttling has its own tests; here every request must reach its view.
    cache.clear()
    response = case.call_and_validate(
        base_url=f"http://{HOST}",
        app=app,
        headers={"Authorization": f"Token {token}"},
        checks=CHECKS,
    )
    answers.append(response.status_code)


def _closed(node: Any) -> Any:
    """`node` (a schema) with every object that names its properties closed to others: a
    field a body has and the schema does not name fails too."""
    if isinstance(node, list):
        return [_closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    closed = {key: _closed(value) for key, value in node.items()}
    if isinstance(node.get("properties"), dict) and "additionalProperties" not in node:
        closed["additionalProperties"] = False
    return closed


CLOSED_SCHEMA = schemathesis.openapi.from_dict(_closed(SERVED_SCHEMA))


@pytest.fixture
def stats(
    make_event: Callable[..., OutboxEvent],
    make_message: Callable[..., InboxMessage],
    kafka_topic: Callable[..., str],
    settings: Any,
) -> None:
    """What makes each part of the stats' bodies present: failures of both sides, an
    analytics run, and a consumer group that committed an offset."""
    from confluent_kafka import Consumer, TopicPartition

    from kafka_events.kafka import kafka_connection_config

    make_event(Status.FAILED)
    make_message(InboxMessage.Status.FAILED)
    result_run()
    topic = kafka_topic()
    consumer = Consumer({**kafka_connection_config(), "group.id": "contract-lag"})
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()
    settings.CONSOLE_CONSUMER_GROUPS = ["contract-lag"]
    cache.clear()


@pytest.mark.parametrize("path", ["/api/stats/summary/", "/api/stats/consumer-lag/"])
def test_the_stats_answer_the_documented_fields_and_no_others(
    path: str, stats: None, app: WSGIHandler, token: str
) -> None:
    case = CLOSED_SCHEMA[path]["GET"].Case()
    response = case.call(
        base_url=f"http://{HOST}", app=app, headers={"Authorization": f"Token {token}"}
    )
    assert response.status_code == 200, response.text
    case.validate_response(response, checks=[response_schema_conformance])
    body = response.json()
    # Each nested part was there to be held to its schema.
    if path == "/api/stats/summary/":
        assert body["analytics"] is not None
        assert {row["side"] for row in body["failures_by_error_class"]} == {"outbox", "inbox"}
    else:
        assert body["reachable"] is True, body["error"]
        committed = [
            row["committed"] for row in body["partitions"] if row["group"] == "contract-lag"
        ]
        assert committed == [0]


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, methods in SERVED_SCHEMA["paths"].items()
        for method, operation in methods.items()
    ]


def _validator(component: str) -> jsonschema.Draft202012Validator:
    document = {"$ref": f"#/components/schemas/{component}", **SERVED_SCHEMA}
    return jsonschema.Draft202012Validator(document)


def test_every_operation_documents_its_error_answers_with_the_error_body() -> None:
    error = {"$ref": "#/components/schemas/Error"}
    assert set(SERVED_SCHEMA["components"]["schemas"]["Error"]["required"]) == {"code", "message"}
    for path, method, operation in _operations():
        expected = {"400", "401", "403", "406", "429"}
        if "{" in path:
            expected.add("404")
        if method == "post":
            expected |= {"415"} if path.startswith("/api/analytics/") else {"409", "415"}
        documented = {
            status
            for status, response in operation["responses"].items()
            if status >= "400" and response["content"]["application/json"]["schema"] == error
        }
        assert documented == expected, (method, path)


BULK_PATHS = [
    (path, method) for path, method, _ in _operations() if "/bulk/" in path and method == "post"
]


@pytest.mark.parametrize(("path", "method"), BULK_PATHS)
def test_a_bulk_request_names_its_rows_by_ids_or_by_filter_not_both(path: str, method: str) -> None:
    body = SERVED_SCHEMA["paths"][path][method]["requestBody"]["content"]["application/json"]
    component = body["schema"]["$ref"].rsplit("/", 1)[1]
    assert len(SERVED_SCHEMA["components"]["schemas"][component]["oneOf"]) == 2
    validator = _validator(component)
    row_id = "7" if path.startswith("/api/inbox/") else "e3e70682-c209-4cac-a29f-6fbed82c07cd"
    ids = [int(row_id)] if row_id.isdigit() else [row_id]
    assert validator.is_valid({"ids": ids, "dry_run": True})
    assert validator.is_valid({"filter": {"status": "FAILED"}, "reason": "after the outage"})
    assert not validator.is_valid({"ids": ids, "filter": {"status": "FAILED"}})
    assert not validator.is_valid({"dry_run": True})
    assert not validator.is_valid({"filter": {}})
    assert not validator.is_valid({"filter": {"stauts": "FAILED"}})
    assert not validator.is_valid({"filter": {"status": "LOST"}})


# Filters and bodies the database could not compare: each was a 500 (DataError) before.
OUT_OF_RANGE = [
    "/api/analytics/lag-stats/?hour_after=2026-03-01T00:00:00%2B22:00",
    "/api/analytics/duplicate-stats/?hour_before=3397-04-15T04:08:07-21:12",
    "/api/analytics/relay-stats/?hour_after=2026-03-01T00:00:00-16:00",
    "/api/analytics/runs/?window_after=2026-03-01T00:00:00%2B16:00",
    "/api/outbox/events/?created_after=0001-01-01T00:00:00%2B05:00",
    "/api/outbox/events/?published_before=9999-12-31T23:00:00-05:00",
    "/api/inbox/messages/?received_after=2439-07-13T16:18:57%2B22:01",
]


@pytest.mark.parametrize("url", OUT_OF_RANGE)
def test_a_date_the_database_cannot_compare_is_a_400_with_a_code(url: str, token: str) -> None:
    response = APIClient().get(url, HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "validation_error"
    assert "UTC" in body["message"]
    assert list(body["errors"]) == [url.split("?")[1].split("=")[0]]


def test_a_window_with_an_offset_the_database_refuses_is_a_400(token: str) -> None:
    response = APIClient().post(
        "/api/analytics/runs/start/",
        {"since": "2026-03-01T00:00:00+22:00", "until": "2026-03-01T06:00:00Z"},
        format="json",
        HTTP_AUTHORIZATION=f"Token {token}",
    )
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "validation_error"
    assert "since" in response.json()["errors"]


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64!",
        # Decodes, but its position is no time (the inbox orders by received_at).
        base64.b64encode(b"o=0&r=0&p=yesterday").decode(),
        # Decodes, but its position is beyond a bigint (the findings order by id).
        base64.b64encode(b"o=0&r=0&p=99999999999999999999999").decode(),
    ],
)
def test_a_cursor_the_list_did_not_give_is_a_400(cursor: str, token: str, rows: Any) -> None:
    for url in ("/api/inbox/messages/", "/api/analytics/findings/"):
        response = APIClient().get(url, {"cursor": cursor}, HTTP_AUTHORIZATION=f"Token {token}")
        assert response.status_code == 400, (url, response.content)
        assert response.json()["code"] == "invalid_cursor"


def test_a_format_the_api_has_no_renderer_for_is_a_406(token: str) -> None:
    response = APIClient().get(
        "/api/outbox/events/", {"format": "xml"}, HTTP_AUTHORIZATION=f"Token {token}"
    )
    assert response.status_code == 406, response.content
    assert response.json()["code"] == "not_acceptable"
    assert "json" in response.json()["message"]
