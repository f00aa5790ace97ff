"""The Kafka connection every client shares: the dict KAFKA_EVENTS of kafka_events/conf.py,
where its keys are documented with their defaults. Each key is read from the variable
KAFKA_<KEY> when it is set, e.g. KAFKA_BOOTSTRAP_SERVERS="kafka-1:9092,kafka-2:9092" and
KAFKA_CLIENT_CONFIG="security.protocol=SASL_SSL,sasl.mechanism=PLAIN"."""

from project.settings.environment import env_settings

KAFKA_EVENTS = env_settings("KAFKA_", {"BOOTSTRAP_SERVERS": str, "CLIENT_CONFIG": dict})
