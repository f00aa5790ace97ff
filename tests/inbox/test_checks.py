"""inbox/checks.py"""

import logging

import pytest
from django.core.management import call_command

from inbox import handler
from inbox.checks import MS_PER_DAY, check_inbox_settings, topic_retention_warnings
from inbox.consumer import InboxConsumer
from tests.app_settings import override_app_settings


def warning_ids() -> list[str]:
    return [message.id for message in check_inbox_settings() if message.id]


def test_the_default_retention_covers_kafka_s_default_topic_settings():
    # retention.ms 7 days + segment.ms 7 days: a record can be delivered again for 14 days.
    with override_app_settings("INBOX", RETENTION_DAYS=14):
        assert "inbox.W001" not in warning_ids()
    with override_app_settings("INBOX", RETENTION_DAYS=13):
        assert "inbox.W001" in warning_ids()


def test_the_retry_backoff_does_not_bear_on_the_retention():
    # Retries run from the stored row, which the purge never deletes before it is DONE.
    with override_app_settings("INBOX", RETENTION_DAYS=14, RETRY_MAX_SECONDS=30 * 86_400):
        assert "inbox.W001" not in warning_ids()


def days_ms(days: float) -> str:
    return str(int(days * MS_PER_DAY))


@pytest.mark.kafka
@override_app_settings("INBOX", RETENTION_DAYS=14)
def test_topics_kept_longer_than_the_inbox_s_retention_are_named(kafka_topic):
    short = kafka_topic(config={"retention.ms": days_ms(3), "segment.ms": days_ms(1)})
    default = kafka_topic()  # the broker's defaults: 7 + 7 days
    long = kafka_topic(config={"retention.ms": days_ms(10), "segment.ms": days_ms(7)})
    forever = kafka_topic(config={"retention.ms": "-1"})

    warnings = topic_retention_warnings(topics=[short, default, long, forever])

    assert sorted(warning.split(" can deliver")[0] for warning in warnings) == sorted(
        [f"Topic {long}", f"Topic {forever}"]
    )
    assert f"Topic {long} can deliver a record again for up to 17 days" in " ".join(warnings)
    assert f"Topic {forever} can deliver a record again for ever" in " ".join(warnings)


@pytest.mark.kafka
@override_app_settings("INBOX", RETENTION_DAYS=14)
def test_inbox_consume_warns_about_them_at_start(kafka_topic, inbox_registry, monkeypatch, caplog):
    topic = kafka_topic(config={"retention.ms": "-1"})
    handler(event_type="E", topic=topic, group="retention-check")(lambda message: None)
    monkeypatch.setattr(InboxConsumer, "run", lambda self: None)
    with caplog.at_level(logging.WARNING, logger="inbox.management.commands.inbox_consume"):
        call_command("inbox_consume", "--group", "retention-check")
    assert f"Topic {topic} can deliver a record again for ever" in caplog.text


def test_an_unknown_ordering_is_an_error():
    with override_app_settings("INBOX", ORDERING="key", GROUP_ORDERING={"delivery": "none"}):
        assert "inbox.E003" not in warning_ids()
    with override_app_settings("INBOX", ORDERING="keys"):
        assert "inbox.E003" in warning_ids()
    with override_app_settings("INBOX", ORDERING="key", GROUP_ORDERING={"delivery": "fifo"}):
        messages = [m for m in check_inbox_settings() if m.id == "inbox.E003"]
        assert [m.msg for m in messages] == ["""INBOX["GROUP_ORDERING"]['delivery'] is 'fifo'."""]


def test_the_group_protocol_is_checked_with_the_properties_it_refuses():
    with override_app_settings("INBOX", GROUP_PROTOCOL="kip848"):
        assert "inbox.E004" in warning_ids()
    with override_app_settings(
        "INBOX", GROUP_PROTOCOL="classic", CONSUMER_CONFIG={"session.timeout.ms": "10000"}
    ):
        assert not {"inbox.E004", "inbox.E005"} & set(warning_ids())
    with override_app_settings(
        "INBOX",
        GROUP_PROTOCOL="consumer",
        CONSUMER_CONFIG={"session.timeout.ms": "10000", "fetch.min.bytes": "1"},
    ):
        [error] = [m for m in check_inbox_settings() if m.id == "inbox.E005"]
        assert "session.timeout.ms" in error.msg
        assert "group.consumer.session.timeout.ms" in (error.hint or "")


def test_a_misspelt_key_and_a_mistyped_value_are_errors_naming_the_key(settings):
    settings.INBOX = {"ORDERINGS": "key", "RETENTION_DAYS": "14"}
    assert [(m.id, m.msg) for m in check_inbox_settings()] == [
        ("inbox.E010", 'INBOX["ORDERINGS"]: not a setting of the inbox; did you mean "ORDERING"?'),
        ("inbox.E011", """INBOX["RETENTION_DAYS"]: must be an integer; got '14' (str)."""),
    ]


def test_the_batch_deadline_is_checked_against_the_poll_interval_it_derives_from(settings):
    settings.INBOX = {"MAX_POLL_INTERVAL_MS": 30_000}
    assert "inbox.E002" not in warning_ids()  # 10 s, a third of it
    settings.INBOX = {"MAX_POLL_INTERVAL_MS": 30_000, "BATCH_MAX_SECONDS": 30}
    assert "inbox.E002" in warning_ids()
