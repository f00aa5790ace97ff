"""The console reads consumer lag from a broker whose group coordinator is not ready yet.

A broker that no group has used has no __consumer_offsets topic: the first group request
creates it, and the coordinator answers NOT_COORDINATOR while it loads. librdkafka's admin
client handles that answer by re-querying the coordinator through a consumer group it does
not have, and the process dies of a segmentation fault (librdkafka issue 5040): the web
worker that rendered the dashboard, taking its other requests with it. So the read runs in a
process of its own here, against a broker of its own."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType
from django.conf import settings

from console.consumer_lag import _read_consumer_lag
from kafka_events.kafka import kafka_connection_config
from scenarios import ports
from tests.scenarios.conftest import SERVICES_SCRIPT, free_block

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

OFFSETS_TOPIC = "__consumer_offsets"

READ_LAG = """
import json, sys
import django
django.setup()
from console.consumer_lag import _read_consumer_lag
lag = _read_consumer_lag({"never-seen-group": [sys.argv[1]]}, timeout=10)
print(json.dumps(lag.as_dict()))
"""


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[str]:
    """A single-node broker that no client has used, on the Kafka ports of a free block."""
    block = free_block(besides=(ports.recorded_block().number,))
    folder = tmp_path / "fresh-broker"
    (folder / "kafka").mkdir(parents=True)
    jars = Path(settings.BASE_DIR) / ".local" / "kafka" / "libs"
    if jars.is_dir():  # the same files `kafka-up` would fetch, fetched once
        (folder / "kafka" / "libs").symlink_to(jars)
    env = {
        **os.environ,
        "LOCAL_DIR": str(folder),
        "KAFKA_BROKERS": "1",
        "KAFKA_PORT_BASE": str(block.kafka_port_base),
        "KAFKA_CONTROLLER_PORT_BASE": str(block.controller_port_base),
        "KAFKA_SECURE_PORT_BASE": str(block.kafka_secure_port_base),
    }
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    subprocess.run([SERVICES_SCRIPT, "kafka-up"], env=env, check=True, capture_output=True)
    try:
        yield f"127.0.0.1:{block.kafka(1)}"
    finally:
        subprocess.run([SERVICES_SCRIPT, "kafka-down"], env=env, check=True, capture_output=True)


def test_lag_is_read_from_a_broker_whose_group_coordinator_is_still_loading(fresh_broker):
    admin = AdminClient({"bootstrap.servers": fresh_broker})
    topic = "orders.fresh"
    admin.create_topics([NewTopic(topic, num_partitions=3)])[topic].result(timeout=30)
    # The fault: no group request has reached this broker yet.
    assert OFFSETS_TOPIC not in admin.list_topics(timeout=10).topics

    process = subprocess.run(
        [sys.executable, "-c", READ_LAG, topic],
        cwd=settings.BASE_DIR,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": fresh_broker},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert process.returncode == 0, process.stderr
    lag = json.loads(process.stdout.splitlines()[-1])
    assert lag["reachable"], lag
    # Each partition answered: no offset committed, nothing produced yet.
    assert [(row["partition"], row["committed"], row["lag"]) for row in lag["partitions"]] == [
        (0, None, 0),
        (1, None, 0),
        (2, None, 0),
    ]
    # The read was the broker's first group request: it created the coordinator's topic.
    assert OFFSETS_TOPIC in admin.list_topics(timeout=10).topics


def test_lag_is_read_through_tls_and_scram_as_a_user_allowed_to_describe_the_group_and_topic(
    secured_kafka, kafka_topic, kafka_consumer_config, settings
):
    """The console's user needs DESCRIBE on the groups and topics it shows, nothing more
    (docs/integration.md)."""
    topic = kafka_topic(partitions=2)
    group = kafka_consumer_config["group.id"]
    producer = Producer(kafka_connection_config())
    for number in range(3):
        producer.produce(topic, value=str(number).encode(), partition=0)
    assert producer.flush(30) == 0
    member = Consumer(kafka_consumer_config)
    member.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    member.close()
    console = secured_kafka.user("outbox-console")
    secured_kafka.allow(console, ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    secured_kafka.allow(console, ResourceType.GROUP, group, AclOperation.DESCRIBE)
    settings.KAFKA_EVENTS = {
        "BOOTSTRAP_SERVERS": secured_kafka.bootstrap,
        "CLIENT_CONFIG": secured_kafka.client_config(console),
    }

    lag = _read_consumer_lag({group: [topic]}, timeout=10)

    assert [(p.partition, p.committed, p.high_watermark, p.lag) for p in lag.partitions] == [
        (0, 2, 3, 1),
        (1, None, 0, 0),
    ]
