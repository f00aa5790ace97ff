"""What the outbox and the inbox share, in any Django project that installs them: the
AppSettings of their settings dicts and the Kafka connection's (conf.py), the Kafka
connection config and the OpenTelemetry tracing they make spans with."""
