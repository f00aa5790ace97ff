"""Results of the analytics job. Every result row belongs to one AnalyticsRun; a later run
of the same window replaces them. Lags are in seconds; an hour is the hour (UTC) in which
the outbox event was created."""

from django.db import models
from django.utils import timezone


class AnalyticsRunPermission(models.TextChoices):
    """The permissions on analytics runs, declared once; code names them by member."""

    # Starting a run (admin button, API) is an operator action with its own permission.
    RUN = "analytics.run_analytics", "Can start an analytics run"


class AnalyticsRun(models.Model):
    class Status(models.TextChoices):
        RUNNING = "RUNNING", "Running"
        SUCCEEDED = "SUCCEEDED", "Succeeded"
        FAILED = "FAILED", "Failed"

    class Trigger(models.TextChoices):
        COMMAND = "command", "Command"
        BEAT = "beat", "Beat"
        ADMIN = "admin", "Admin"
        API = "api", "API"
        BENCHMARK = "benchmark", "Benchmark"

    # The window covers the outbox events created in [window_start, window_end).
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    status = models.CharField(max_length=9, choices=Status.choices, default=Status.RUNNING)
    trigger = models.CharField(max_length=9, choices=Trigger.choices, default=Trigger.COMMAND)
    spark_master = models.CharField(max_length=255, blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_seconds = models.FloatField(null=True, blank=True)
    # Outbox rows + inbox rows + Kafka records the job read.
    rows_read = models.BigIntegerField(default=0)
    outbox_rows = models.BigIntegerField(default=0)
    inbox_rows = models.BigIntegerField(default=0)
    kafka_records = models.BigIntegerField(default=0)
    findings = models.IntegerField(default=0)
    # Counts per finding kind (all of them, also those past the per-kind cap), totals.
    summary = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    # The process running the job (host:pid) and when it last said it was alive (the
    # database's clock). A RUNNING run whose heartbeat is older than ANALYTICS_RUN_STALE_SECONDS
    # lost its worker: beat's reaper marks it FAILED.
    worker = models.CharField(max_length=255, blank=True, default="")
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "analytics_run"
        ordering = ("-started_at",)
        permissions = tuple(
            (permission.value.partition(".")[2], permission.label)
            for permission in AnalyticsRunPermission
        )
        indexes = (
            models.Index(fields=("window_start", "window_end"), name="analytics_run_window_idx"),
            models.Index(fields=("status", "started_at"), name="analytics_run_status_idx"),
        )

    def __str__(self) -> str:
        return (
            f"{self.window_start:%Y-%m-%d %H:%M} - {self.window_end:%Y-%m-%d %H:%M} ({self.status})"
        )


class DeliveryLagStat(models.Model):
    """Lag percentiles of one stage for one hour, topic, event type and consumer group."""

    class Stage(models.TextChoices):
        # published_at - created_at; one row per event, so consumer_group is empty.
        PUBLISH = "publish", "Publish"
        # processed_at - published_at
        CONSUME = "consume", "Consume"
        # processed_at - created_at
        END_TO_END = "end_to_end", "End to end"

    run = models.ForeignKey(AnalyticsRun, on_delete=models.CASCADE, related_name="lag_stats")
    hour = models.DateTimeField()
    topic = models.CharField(max_length=249)
    event_type = models.CharField(max_length=255)
    consumer_group = models.CharField(max_length=255, blank=True, default="")
    stage = models.CharField(max_length=10, choices=Stage.choices)
    count = models.BigIntegerField()
    p50 = models.FloatField()
    p95 = models.FloatField()
    p99 = models.FloatField()
    max = models.FloatField()

    class Meta:
        db_table = "analytics_delivery_lag_stat"
        ordering = ("hour", "topic", "event_type", "consumer_group", "stage")
        indexes = (
            models.Index(fields=("hour", "stage"), name="analytics_lag_hour_idx"),
            models.Index(fields=("topic", "hour"), name="analytics_lag_topic_idx"),
        )

    def __str__(self) -> str:
        return f"{self.stage} lag {self.topic}/{self.event_type}/{self.consumer_group} {self.hour}"


class DuplicateStat(models.Model):
    """What one consumer group received of one hour's events of one topic."""

    run = models.ForeignKey(AnalyticsRun, on_delete=models.CASCADE, related_name="duplicate_stats")
    hour = models.DateTimeField()
    topic = models.CharField(max_length=249)
    consumer_group = models.CharField(max_length=255)
    # deliveries = unique_events + duplicate_deliveries
    deliveries = models.BigIntegerField()
    unique_events = models.BigIntegerField()
    duplicate_deliveries = models.BigIntegerField()
    # duplicate_deliveries / deliveries
    duplicate_rate = models.FloatField()
    # The most deliveries of one event id in this group.
    max_copies = models.IntegerField()

    class Meta:
        db_table = "analytics_duplicate_stat"
        ordering = ("hour", "topic", "consumer_group")
        indexes = (models.Index(fields=("hour",), name="analytics_dup_hour_idx"),)

    def __str__(self) -> str:
        return f"duplicates {self.topic}/{self.consumer_group} {self.hour}"


class RelayStat(models.Model):
    """The relay's side of one hour's events of one topic: retries and failures."""

    run = models.ForeignKey(AnalyticsRun, on_delete=models.CASCADE, related_name="relay_stats")
    hour = models.DateTimeField()
    topic = models.CharField(max_length=249)
    events = models.BigIntegerField()
    published = models.BigIntegerField()
    pending = models.BigIntegerField()
    failed = models.BigIntegerField()
    # Events that took more than one attempt (attempts > 1).
    retried = models.BigIntegerField()
    # retried / events, failed / events
    retry_rate = models.FloatField()
    failure_rate = models.FloatField()
    max_attempts = models.IntegerField()

    class Meta:
        db_table = "analytics_relay_stat"
        ordering = ("hour", "topic")
        indexes = (models.Index(fields=("hour",), name="analytics_relay_hour_idx"),)

    def __str__(self) -> str:
        return f"relay {self.topic} {self.hour}"


class ReconciliationFinding(models.Model):
    """One event that outbox, Kafka log and inbox disagree about."""

    class Kind(models.TextChoices):
        # DONE, but an expected consumer group recorded it late or never.
        NOT_CONSUMED = "not_consumed", "Not consumed"
        # PENDING for longer than the SLA.
        STUCK = "stuck", "Stuck"
        # In the Kafka log at more than one offset.
        RESENT = "resent", "Re-sent"
        # DONE, but absent from the Kafka log.
        MISSING_FROM_KAFKA = "missing_from_kafka", "Missing from Kafka"

    run = models.ForeignKey(AnalyticsRun, on_delete=models.CASCADE, related_name="findings_set")
    kind = models.CharField(max_length=18, choices=Kind.choices)
    event_id = models.CharField(max_length=255)
    topic = models.CharField(max_length=249)
    event_type = models.CharField(max_length=255, blank=True, default="")
    consumer_group = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)
    kafka_partition = models.IntegerField(null=True, blank=True)
    # Every offset the event was found at (re-sent), or the one the outbox recorded.
    kafka_offsets = models.JSONField(default=list, blank=True)
    detail = models.TextField(blank=True, default="")

    class Meta:
        db_table = "analytics_reconciliation_finding"
        ordering = ("kind", "created_at")
        indexes = (
            models.Index(fields=("kind",), name="analytics_finding_kind_idx"),
            models.Index(fields=("event_id",), name="analytics_finding_event_idx"),
        )

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.event_id}"
