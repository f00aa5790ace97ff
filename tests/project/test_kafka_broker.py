import uuid

import pytest
from confluent_kafka import Consumer, Producer

from kafka_events.kafka import kafka_connection_config

pytestmark = pytest.mark.kafka


def test_a_record_goes_through_the_real_broker(kafka_topic, kafka_consumer_config):
    topic = kafka_topic()
    key, value = b"key-1", uuid.uuid4().hex.encode()
    delivered = []
    producer = Producer({**kafka_connection_config(), "enable.idempotence": True, "acks": "all"})
    producer.produce(
        topic,
        key=key,
        value=value,
        headers={"event_id": b"e-1"},
        on_delivery=lambda error, message: delivered.append((error, message)),
    )
    assert producer.flush(30) == 0
    assert delivered[0][0] is None
    assert delivered[0][1].offset() == 0

    consumer = Consumer(kafka_consumer_config)
    consumer.subscribe([topic])
    try:
        message = None
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                break
        assert message is not None
        assert message.error() is None
        assert (message.key(), message.value()) == (key, value)
        assert message.headers() == [("event_id", b"e-1")]
        assert message.offset() == 0
    finally:
        consumer.close()
