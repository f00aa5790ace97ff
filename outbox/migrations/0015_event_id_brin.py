import django.contrib.postgres.indexes
from django.db import migrations, models

import outbox.ids

# The event table's B-tree on the id goes: its leaf insert was a WAL record in every publish()
# (about 70 of its 1,500 bytes) and a part of its time. A BRIN index finds an event by id
# instead: the ids publish() draws are time-ordered (version 7) since before this migration.
#
# The given ids' table keeps a caller's ids unique, and publish() looks for one of its own
# ids among the events of the id's millisecond. The events from before partitioning (the
# partition FROM MINVALUE, migration 0014) are older than both: their ids are copied into the
# given ids' table, so that none can be given again. Retention deletes them with their events.
#
# A held event's row was found by its id. It is now found by its own transaction id and
# position (the relay's index of commit order), kept with it: the same as its place in the
# key's order but for an event replayed with its own id. A held row whose event is gone is
# let go, as the relay does.

GIVEN_IDS_OF_EVENTS_BEFORE_PARTITIONING = """
DO $$
BEGIN
    IF to_regclass('outbox_event_before_partitioning') IS NOT NULL THEN
        INSERT INTO outbox_event_given_id (id, created_at)
        SELECT id, created_at FROM outbox_event_before_partitioning
        ON CONFLICT (id) DO NOTHING;
    END IF;
END
$$;
"""


HELD_EVENT_ROWS = """
ALTER TABLE outbox_held_event ADD COLUMN event_transaction_id bigint,
                              ADD COLUMN event_position bigint;
UPDATE outbox_held_event AS held
SET event_transaction_id = event.txid::text::bigint, event_position = event.position
FROM outbox_event AS event
WHERE event.id = held.event_id;
DELETE FROM outbox_held_event WHERE event_position IS NULL;
ALTER TABLE outbox_held_event ALTER COLUMN event_transaction_id SET NOT NULL,
                              ALTER COLUMN event_position SET NOT NULL;
"""
HELD_EVENT_ROWS_REVERSE = """
ALTER TABLE outbox_held_event DROP COLUMN event_transaction_id, DROP COLUMN event_position;
"""


class Migration(migrations.Migration):
    dependencies = [("outbox", "0014_partitioned_event_log")]

    operations = [
        migrations.RunSQL(GIVEN_IDS_OF_EVENTS_BEFORE_PARTITIONING, migrations.RunSQL.noop),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(HELD_EVENT_ROWS, HELD_EVENT_ROWS_REVERSE)],
            state_operations=[
                migrations.AddField(
                    model_name="outboxheldevent",
                    name="event_transaction_id",
                    field=models.BigIntegerField(),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="outboxheldevent",
                    name="event_position",
                    field=models.BigIntegerField(),
                    preserve_default=False,
                ),
            ],
        ),
        # The model's default, for events made through the ORM: no column default changes.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="outboxevent",
                    name="id",
                    field=models.UUIDField(
                        db_column="id",
                        default=outbox.ids.new_event_id,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
            ]
        ),
        migrations.AddIndex(
            model_name="outboxevent",
            index=django.contrib.postgres.indexes.BrinIndex(
                autosummarize=True,
                fields=["id"],
                name="outbox_event_id_brin",
                opclasses=("uuid_minmax_multi_ops",),
            ),
        ),
        migrations.RunSQL(
            "DROP INDEX outbox_event_id_idx",
            "CREATE INDEX outbox_event_id_idx ON outbox_event (id)",
        ),
    ]
