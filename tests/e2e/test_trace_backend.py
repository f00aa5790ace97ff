"""One trace in a real Zipkin, from an HTTP request to the demo's payments endpoint through
the relay, the delivery service's consumer and its handler's own event, read back through
Zipkin's HTTP API; then the console's link from the event to that trace, followed in the
browser.

The web server, the relay and the consumer run as the processes `make run TRACING=1` starts,
each exporting its spans to Zipkin (`scripts/services.sh` starts Zipkin when TRACING=1;
`make test` does)."""

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from django.conf import settings

from outbox.models import OutboxEvent
from tests.e2e.conftest import log_in, needs_browser
from tests.outbox.conftest import subprocess_environment, wait_until

ZIPKIN = f"http://127.0.0.1:{os.environ.get('ZIPKIN_PORT', '9411')}"


def _zipkin_answers() -> bool:
    try:
        return requests.get(f"{ZIPKIN}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


# Skipped only outside `make test`, which starts Zipkin and sets the variable.
pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(
        not os.environ.get("TRACING_BACKEND_REQUIRED") and not _zipkin_answers(),
        reason="needs Zipkin: TRACING=1 scripts/services.sh up",
    ),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def traced_processes(
    transactional_db: None, kafka_topic: Callable[..., str]
) -> Iterator[dict[str, Any]]:
    """The web server, the relay and the delivery group's consumer, each exporting to Zipkin,
    on topics and a group of this test's own."""
    assert _zipkin_answers(), f"Zipkin does not answer at {ZIPKIN}"
    port = _free_port()
    names = {
        "DEMO_PAYMENTS_TOPIC": kafka_topic(),
        "DEMO_DELIVERIES_TOPIC": kafka_topic(),
        "DEMO_DELIVERY_GROUP": f"trace-delivery-{uuid.uuid4().hex[:8]}",
    }
    environment = subprocess_environment(
        **names,
        DEMO_ENABLED="true",
        DEMO_CHAIN="true",
        DEMO_HANDLER_FAILURE_RATE="0",
        OTEL_TRACES_EXPORTER="zipkin",
        OTEL_EXPORTER_ZIPKIN_ENDPOINT=f"{ZIPKIN}/api/v2/spans",
        # Spans reach Zipkin a tenth of a second after they end, not five seconds.
        OTEL_BSP_SCHEDULE_DELAY="100",
        CONSOLE_TRACE_URL_TEMPLATE=f"{ZIPKIN}/zipkin/traces/{{trace_id}}",
    )
    environment.pop("OTEL_SERVICE_NAME", None)
    commands = {
        "web": ["runserver", "--noreload", f"127.0.0.1:{port}"],
        "relay": ["outbox_relay", "--poll-seconds", "0.2"],
        "consumer": ["inbox_consume", "--group", names["DEMO_DELIVERY_GROUP"]],
    }
    processes = {
        name: subprocess.Popen(
            [sys.executable, "manage.py", *command],
            cwd=settings.BASE_DIR,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, command in commands.items()
    }
    try:
        yield {
            "base_url": f"http://127.0.0.1:{port}",
            "environment": environment,
            "started_ms": int(time.time() * 1000),
            **names,
        }
    finally:
        for process in processes.values():
            process.terminate()
        for name, process in processes.items():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            output = process.stdout.read() if process.stdout else ""
            # Shown with a failure: what each process said.
            print(f"--- {name} (exit {process.returncode}) ---\n{output[-4000:]}")


def _post_payment(base_url: str) -> dict[str, Any]:
    body = {"order_id": f"order-{uuid.uuid4().hex[:8]}", "amount": "12.50"}
    deadline = time.monotonic() + 60
    while True:
        try:
            response = requests.post(f"{base_url}/demo/payments/", json=body, timeout=10)
        except requests.ConnectionError:  # the server is still starting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
            continue
        assert response.status_code == 201, response.text
        answer: dict[str, Any] = response.json()
        return answer


def _trace(trace_id: str) -> list[dict[str, Any]]:
    response = requests.get(f"{ZIPKIN}/api/v2/trace/{trace_id}", timeout=5)
    if response.status_code == 404:  # nothing of it has arrived yet
        return []
    response.raise_for_status()
    spans: list[dict[str, Any]] = response.json()
    return spans


def _wait_for_spans(trace_id: str, wanted: set[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """The spans of the trace once every (service, kind, name) wanted has reached Zipkin."""
    spans: list[dict[str, Any]] = []

    def every_span_has_arrived() -> bool:
        spans[:] = _trace(trace_id)
        seen = {(s["localEndpoint"]["serviceName"], s.get("kind"), s["name"]) for s in spans}
        return wanted <= seen

    wait_until(every_span_has_arrived, timeout=90, message=f"the spans of trace {trace_id}")
    return spans


def test_the_demo_request_is_one_trace_in_zipkin(traced_processes: dict[str, Any]) -> None:
    payments = traced_processes["DEMO_PAYMENTS_TOPIC"]
    deliveries = traced_processes["DEMO_DELIVERIES_TOPIC"]
    trace_id = _post_payment(traced_processes["base_url"])["trace_id"]
    assert trace_id
    assert len(trace_id) == 32

    # Zipkin keeps names in lower case; the topics are already.
    spans = _wait_for_spans(
        trace_id,
        {
            ("web", "SERVER", "post demo/payments/"),
            ("web", "PRODUCER", f"create {payments}"),
            ("outbox-relay", "PRODUCER", f"send {payments}"),
            ("inbox-consumer", "CONSUMER", f"process {payments}"),
            ("inbox-consumer", "PRODUCER", f"create {deliveries}"),
            ("outbox-relay", "PRODUCER", f"send {deliveries}"),
        },
    )
    messaging = {span["name"]: span for span in spans if span.get("kind") != "CLIENT"}
    request = messaging["post demo/payments/"]
    assert request["tags"]["http.method"] == "POST"
    assert request["tags"]["http.status_code"] == "201"
    created, sent = messaging[f"create {payments}"], messaging[f"send {payments}"]
    process = messaging[f"process {payments}"]
    chained, chained_sent = messaging[f"create {deliveries}"], messaging[f"send {deliveries}"]
    # request -> create -> send and process -> the handler's create -> its send
    assert created["parentId"] == request["id"]
    assert sent["parentId"] == created["id"]
    assert process["parentId"] == created["id"]
    assert chained["parentId"] == process["id"]
    assert chained_sent["parentId"] == chained["id"]
    assert "parentId" not in request
    assert sent["tags"]["outbox.outcome"] == "published"
    assert sent["tags"]["messaging.destination.name"] == payments
    assert process["tags"]["inbox.outcome"] == "processed"
    group = traced_processes["DEMO_DELIVERY_GROUP"]
    assert process["tags"]["messaging.consumer.group.name"] == group
    # psycopg's spans: each event's insert is a statement inside its create span.
    inserts = {
        span["parentId"]
        for span in spans
        if span.get("kind") == "CLIENT"
        and span["tags"].get("db.system") == "postgresql"
        and "INSERT INTO outbox_event" in span["tags"].get("db.statement", "")
    }
    assert inserts == {created["id"], chained["id"]}

    # The relay's and the consumer's polling, outside any span, made no trace of its own.
    lookback = int(time.time() * 1000) - traced_processes["started_ms"] + 1000
    for service in ("outbox-relay", "inbox-consumer"):
        response = requests.get(
            f"{ZIPKIN}/api/v2/traces",
            params={"serviceName": service, "lookback": lookback, "limit": 1000},
            timeout=10,
        )
        response.raise_for_status()
        statements_alone = [t for t in response.json() if {s.get("kind") for s in t} == {"CLIENT"}]
        assert statements_alone == [], statements_alone[:3]


@needs_browser
def test_the_console_links_an_event_to_its_trace_in_zipkin(
    traced_processes: dict[str, Any], browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    payments = traced_processes["DEMO_PAYMENTS_TOPIC"]
    trace_id = _post_payment(traced_processes["base_url"])["trace_id"]
    _wait_for_spans(trace_id, {("outbox-relay", "PRODUCER", f"send {payments}")})
    # Made by the web's own settings: the tests' password hasher is not the web's.
    password = uuid.uuid4().hex
    created = subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput"],
        cwd=settings.BASE_DIR,
        env={
            **traced_processes["environment"],
            "DJANGO_SUPERUSER_USERNAME": "tracer",
            "DJANGO_SUPERUSER_EMAIL": "tracer@example.com",
            "DJANGO_SUPERUSER_PASSWORD": password,
        },
        capture_output=True,
        text=True,
    )
    assert created.returncode == 0, created.stderr
    event = OutboxEvent.objects.get(topic=payments)
    base_url = traced_processes["base_url"]

    log_in(browser, base_url, "tracer", password)
    browser.get(f"{base_url}/admin/outbox/outboxevent/{event.pk}/change/")
    link = browser.find_element(By.LINK_TEXT, trace_id)
    assert link.get_attribute("href") == f"{ZIPKIN}/zipkin/traces/{trace_id}"
    console = browser.current_window_handle
    link.click()
    WebDriverWait(browser, 10).until(lambda driver: len(driver.window_handles) == 2)
    browser.switch_to.window(next(h for h in browser.window_handles if h != console))
    # Zipkin's page of the trace lists its spans: the relay's send among them.
    WebDriverWait(browser, 30).until(lambda driver: f"send {payments}" in driver.page_source)
    assert trace_id in browser.current_url
    assert "outbox-relay" in browser.page_source
