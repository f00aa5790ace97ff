"""Held rows keep their event's created_at, the event table's partition key, so that a read of
a held event's row probes the partition of its day alone (HELD_EVENT_ROW_JOIN).

The column is filled from the event rows and made NOT NULL in the migration's transaction,
which holds the held set's table locked from the ADD COLUMN on: no relay of the previous
version can add a row without it meanwhile. Held rows whose event is gone are let go, as the
relay lets them go. A relay of the previous version still running after the migration cannot
hold an event (its insert lacks the column) and fails its batch until it is replaced: stop the
relays, migrate, start the new version."""

from django.db import migrations, models

FILL_SQL = """
UPDATE outbox_held_event AS held SET event_created_at = event.created_at
FROM outbox_event AS event
WHERE event.txid = held.event_transaction_id::text::xid8
  AND event.position = held.event_position;
DELETE FROM outbox_held_event WHERE event_created_at IS NULL;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0016_delivery_discarded_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxheldevent",
            name="event_created_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunSQL(FILL_SQL, reverse_sql=migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="outboxheldevent",
            name="event_created_at",
            field=models.DateTimeField(),
        ),
    ]
