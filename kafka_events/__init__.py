"""What the outbox and the inbox share, in any Django project that installs them: the Kafka
connection config and the OpenTelemetry tracing they make spans with."""
