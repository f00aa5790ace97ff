from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """Order per key: the PARKED status, the release of a key, and an index of the rows that
    hold their key (a small one: rows that are done are not in it). The column is nullable
    without a default (no rewrite of the table); the index is built concurrently, so consumers
    keep recording while a big table is indexed."""

    atomic = False

    dependencies = [("inbox", "0004_action_permissions")]

    operations = [
        migrations.AddField(
            model_name="inboxmessage",
            name="released_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name="inboxmessage",
            name="status",
            field=models.CharField(
                choices=[
                    ("PENDING", "Pending"),
                    ("DONE", "Done"),
                    ("FAILED", "Failed"),
                    ("PARKED", "Parked"),
                ],
                default="PENDING",
                max_length=7,
            ),
        ),
        AddIndexConcurrently(
            model_name="inboxmessage",
            index=models.Index(
                condition=~models.Q(status="DONE")
                & models.Q(discarded_at__isnull=True, released_at__isnull=True, key__isnull=False),
                fields=["consumer_group", "topic", "key", "partition", "offset"],
                name="inbox_message_holding_idx",
            ),
        ),
    ]
