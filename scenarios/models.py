from django.db import models
from django.utils import timezone


class ScenarioEffect(models.Model):
    """One run of the scenario handler: the business effect of an event in a consumer group.

    Deliberately without a unique constraint: a handler that runs twice for one event leaves
    two rows, which is what the delivery checker looks for.
    """

    run = models.CharField(max_length=64)
    consumer_group = models.CharField(max_length=255)
    event_id = models.CharField(max_length=255)
    key = models.CharField(max_length=255)
    seq = models.BigIntegerField()
    # The consumer process that applied it: tells a zombie's effect from its successor's.
    pid = models.IntegerField()
    applied_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "scenario_effect"
        indexes = (models.Index(fields=("consumer_group", "id"), name="scenario_effect_group_idx"),)

    def __str__(self) -> str:
        return f"{self.consumer_group} {self.key}#{self.seq} ({self.event_id})"


class ScenarioAggregate(models.Model):
    """An aggregate of the late-lock-writers scenario: its version, which every writer
    increments under the row's lock and publishes with the event (one row per run and key)."""

    run = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    version = models.BigIntegerField(default=0)

    class Meta:
        db_table = "scenario_aggregate"
        constraints = (
            models.UniqueConstraint(fields=("run", "key"), name="scenario_aggregate_run_key"),
        )

    def __str__(self) -> str:
        return f"{self.run} {self.key} v{self.version}"
