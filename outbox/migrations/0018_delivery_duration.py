"""Delivery records keep how long each try took (duration_ms, whole milliseconds).

A nullable column without a default: PostgreSQL adds it to the partitioned table and each of
its partitions in the catalog alone, rewriting no row, so the migration takes a moment however
many records there are. The records written before it read NULL (unknown). A relay of the
previous version still running writes records without a duration (NULL) until it is replaced."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0017_held_event_created_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxdelivery",
            name="duration_ms",
            field=models.IntegerField(blank=True, null=True),
        ),
    ]
