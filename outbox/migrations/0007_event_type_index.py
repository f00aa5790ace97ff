from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """The console's event type filter: a rare type found through an index, not by walking
    the created_at index through the whole table. Built concurrently: the outbox keeps taking
    writes while a big table is indexed."""

    atomic = False

    dependencies = [("outbox", "0006_inbox_discard_action")]

    operations = [
        AddIndexConcurrently(
            model_name="outboxevent",
            index=models.Index(fields=["event_type", "created_at"], name="outbox_event_type_idx"),
        ),
    ]
