"""KAFKA_EVENTS' librdkafka properties in the names of Spark's Java Kafka client
(analytics.jobs.java_kafka_options); the scan through a real secured listener is in
test_jobs_kafka_scan.py."""

import pytest

from analytics.jobs import java_kafka_options


def test_scram_user_and_ca_file_become_a_jaas_login_and_a_pem_trust_store():
    options = java_kafka_options(
        {
            "bootstrap.servers": "kafka1:9093",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "analytics",
            "sasl.password": 'pa"ss\\word',
            "ssl.ca.location": "/etc/kafka/ca.pem",
        }
    )

    assert options == {
        "bootstrap.servers": "kafka1:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="analytics" password="pa\\"ss\\\\word";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/kafka/ca.pem",
    }


def test_plain_is_the_mechanism_of_a_user_without_one_and_none_turns_off_host_checks():
    options = java_kafka_options(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )

    assert options["sasl.mechanism"] == "PLAIN"
    assert options["sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
    )
    assert options["ssl.endpoint.identification.algorithm"] == ""
    assert "sasl.mechanisms" not in options
    assert "sasl.username" not in options


def test_a_jaas_config_given_is_kept_and_other_properties_pass_through():
    given = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": "org.example.Login required;",
        "client.id": "analytics",
    }

    assert java_kafka_options(given) == given


def test_a_user_of_a_mechanism_without_a_login_module_is_refused_with_what_to_set():
    with pytest.raises(ValueError, match=r"set sasl\.jaas\.config"):
        java_kafka_options({"sasl.mechanism": "GSSAPI", "sasl.username": "u"})
