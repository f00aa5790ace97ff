import django.contrib.postgres.indexes
from django.db import migrations, models

import outbox.models


class Migration(migrations.Migration):
    """Three B-tree indexes on the event table instead of seven: each one wrote a WAL record of
    about 80 bytes in every business transaction that published. The console orders its lists
    by the relay's (txid, position) index, which the model now names, and finds a time range by
    a BRIN index. Events written before the event-log relay get transaction id 0, so that the
    column can be NOT NULL and the newest events come first; the relay never reads below its
    cursors, which are past them."""

    dependencies = [("outbox", "0012_claim_relay_removed")]

    operations = [
        migrations.RunSQL(
            "UPDATE outbox_event SET txid = '0'::xid8 WHERE txid IS NULL;"
            "ALTER TABLE outbox_event ALTER COLUMN txid SET NOT NULL;",
            "ALTER TABLE outbox_event ALTER COLUMN txid DROP NOT NULL;",
        ),
        # The column and its index exist since migration 0009, made in SQL.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="outboxevent",
                    name="transaction_id",
                    field=outbox.models.TransactionIdField(
                        db_column="txid",
                        db_default=models.Func(function="pg_current_xact_id"),
                        editable=False,
                    ),
                ),
                migrations.AddIndex(
                    model_name="outboxevent",
                    index=models.Index(
                        fields=["transaction_id", "position"], name="outbox_event_txid_idx"
                    ),
                ),
            ]
        ),
        migrations.AlterModelOptions(
            name="outboxevent",
            options={
                "ordering": ("-transaction_id", "-position"),
                "permissions": (
                    ("retry_outboxevent", "Can retry outbox events"),
                    ("discard_outboxevent", "Can discard outbox events"),
                    ("replay_outboxevent", "Can replay outbox events"),
                    ("release_outboxkey", "Can release quarantined outbox keys"),
                ),
            },
        ),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_created_idx"),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_topic_idx"),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_aggr_idx"),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_type_idx"),
        migrations.AddIndex(
            model_name="outboxevent",
            index=django.contrib.postgres.indexes.BrinIndex(
                autosummarize=True, fields=["created_at"], name="outbox_event_created_brin"
            ),
        ),
    ]
