"""inbox/config.py"""

from inbox.config import inbox_consumer_config
from tests.app_settings import override_app_settings


def test_the_inbox_guarantees_cannot_be_configured_away():
    with override_app_settings(
        "INBOX",
        CONSUMER_CONFIG={
            "enable.auto.commit": "true",
            "enable.auto.offset.store": "true",
            "isolation.level": "read_uncommitted",
            "fetch.min.bytes": "1024",
        },
    ):
        config = inbox_consumer_config(group="delivery", **{"enable.auto.commit": True})
    assert config["enable.auto.commit"] is False
    assert config["enable.auto.offset.store"] is False
    assert config["isolation.level"] == "read_committed"
    assert config["fetch.min.bytes"] == "1024"  # other properties pass through
    assert config["group.id"] == "delivery"


@override_app_settings(
    "KAFKA_EVENTS",
    BOOTSTRAP_SERVERS="kafka-1:9092",
    CLIENT_CONFIG={"security.protocol": "SSL"},
)
def test_connection_settings_come_from_the_shared_kafka_config():
    config = inbox_consumer_config(group="delivery")
    assert config["bootstrap.servers"] == "kafka-1:9092"
    assert config["security.protocol"] == "SSL"


def test_overrides_set_the_group_id_for_tools():
    assert inbox_consumer_config(group="g", **{"group.id": "other"})["group.id"] == "other"


def test_the_group_protocol_is_inbox_group_protocol():
    assert inbox_consumer_config(group="g")["group.protocol"] == "classic"
    with override_app_settings("INBOX", GROUP_PROTOCOL="consumer"):
        assert inbox_consumer_config(group="g")["group.protocol"] == "consumer"
