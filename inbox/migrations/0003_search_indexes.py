from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """The console's search by aggregate id or key, served by indexes instead of a scan of the
    table. Built concurrently: consumers keep recording while a big table is indexed."""

    atomic = False

    dependencies = [("inbox", "0002_inbox_discarded_at")]

    operations = [
        AddIndexConcurrently(
            model_name="inboxmessage",
            index=models.Index(fields=["aggregate_id"], name="inbox_message_aggregate_idx"),
        ),
        AddIndexConcurrently(
            model_name="inboxmessage",
            index=models.Index(fields=["key"], name="inbox_message_key_idx"),
        ),
    ]
