import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    """The console's publish rates with the event-log relay: its PUBLISHED records by
    published_at, through a BRIN index (tiny, and nearly free for the relay to keep: a B-tree
    would add WAL to every delivery record written). Built concurrently: the relay keeps
    recording deliveries while a big table is indexed."""

    atomic = False

    dependencies = [("outbox", "0010_delivery_discarded")]

    operations = [
        AddIndexConcurrently(
            model_name="outboxdelivery",
            index=django.contrib.postgres.indexes.BrinIndex(
                autosummarize=True,
                fields=["published_at"],
                name="outbox_delivery_published_brin",
            ),
        ),
    ]
