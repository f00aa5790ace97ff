from project.settings.environment import env

# Comma-separated host:port list, as librdkafka's bootstrap.servers expects.
KAFKA_BOOTSTRAP_SERVERS = env("KAFKA_BOOTSTRAP_SERVERS", default="127.0.0.1:9092")
# Extra librdkafka properties for every client (e.g. security.protocol, sasl.*), as
# comma-separated key=value pairs: KAFKA_CLIENT_CONFIG="security.protocol=SASL_SSL,...".
KAFKA_CLIENT_CONFIG: dict[str, str] = env.dict("KAFKA_CLIENT_CONFIG", default={})
