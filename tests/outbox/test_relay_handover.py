"""Each relay refuses a database the other one has been sending: either would send the other's
deliveries again. The claim relay keeps its progress on the event rows, the event-log relay in
its cursors; `outbox_log_take_over` hands a database from the first to the second."""

import logging

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

import outbox
from outbox.models import OutboxEvent
from outbox.relay import Relay
from outbox.services.event_log import claim_relay_refusal, log_relay_refusal
from outbox.tasks import relay as relay_task

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def publish(topic: str, key: str = "k") -> OutboxEvent:
    with transaction.atomic():
        return outbox.publish(
            aggregate_type="order", aggregate_id=key, event_type="E", payload={}, topic=topic
        )


def test_a_database_no_relay_has_sent_from_takes_either_relay(kafka_topic):
    publish(kafka_topic())

    assert claim_relay_refusal() is None
    assert log_relay_refusal() is None


def test_the_event_log_relay_refuses_what_the_claim_relay_sends_until_the_take_over(
    kafka_topic, settings, caplog
):
    topic = kafka_topic()
    publish(topic)
    assert Relay().run().published == 1
    waiting = publish(topic)

    with pytest.raises(CommandError, match="outbox_log_take_over"):
        call_command("outbox_relay", "--log")
    settings.OUTBOX_RELAY_LOG = True
    with caplog.at_level(logging.ERROR, logger="outbox.tasks"):
        assert relay_task() == 0
    assert "outbox_log_take_over" in caplog.text

    call_command("outbox_log_take_over")

    assert log_relay_refusal() is None
    assert relay_task() == 1  # the event the claim relay left, and only that one
    assert OutboxEvent.objects.get(pk=waiting.pk).status == "PENDING"  # the row is not touched
    settings.OUTBOX_RELAY_LOG = False
    with pytest.raises(CommandError, match="OUTBOX_RELAY_LOG=true"):
        call_command("outbox_relay")
    later = publish(topic)
    assert relay_task() == 0
    assert OutboxEvent.objects.filter(pk=later.pk, attempts=0, locked_until__isnull=True).exists()


def test_events_written_before_the_event_log_existed_wait_for_the_take_over(kafka_topic):
    event = publish(kafka_topic())
    with connection.cursor() as db:  # as migration 0009 leaves the events it found
        db.execute("UPDATE outbox_event SET txid = NULL WHERE id = %s", [event.id])

    assert log_relay_refusal() is not None
    assert claim_relay_refusal() is None
