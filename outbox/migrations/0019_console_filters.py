# The console's filters that matched few events read the whole event or delivery table: the
# aggregate, type and topic filters get a BRIN index of bloom filters, the error-class filter an
# index of the failed tries by class, the creation time's BRIN index ranges of 8 pages (for the
# look-up of an event by its id and the time it carries), and a discard's record the place of
# its event row. None adds a WAL record to a publish() while the range being filled has no
# summary; the new columns are NULL (no byte) on the records the relay writes.
import django.contrib.postgres.indexes
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0018_delivery_duration"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="outboxevent",
            name="outbox_event_created_brin",
        ),
        migrations.AddField(
            model_name="outboxdelivery",
            name="event_created_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="outboxdelivery",
            name="event_position",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="outboxdelivery",
            name="event_transaction_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="outboxdelivery",
            index=models.Index(
                models.Func(
                    models.Func(
                        models.F("error"),
                        models.Value("\n"),
                        models.Value(1),
                        function="split_part",
                    ),
                    models.Value(":"),
                    models.Value(1),
                    function="split_part",
                    output_field=models.CharField(),
                ),
                models.F("published_at"),
                condition=models.Q(("outcome", "FAILED")),
                name="outbox_delivery_errclass_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="outboxevent",
            index=django.contrib.postgres.indexes.BrinIndex(
                autosummarize=True,
                fields=["created_at"],
                name="outbox_event_created_brin",
                pages_per_range=8,
            ),
        ),
        migrations.AddIndex(
            model_name="outboxevent",
            index=django.contrib.postgres.indexes.BrinIndex(
                autosummarize=True,
                fields=["aggregate_type", "aggregate_id", "event_type", "topic"],
                name="outbox_event_filter_bloom",
                opclasses=(
                    "text_bloom_ops",
                    "text_bloom_ops(n_distinct_per_range = -1)",
                    "text_bloom_ops",
                    "text_bloom_ops",
                ),
                pages_per_range=16,
            ),
        ),
    ]
