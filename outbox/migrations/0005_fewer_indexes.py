from django.db import migrations, models


class Migration(migrations.Migration):
    """Fewer indexes to write when the relay marks a row DONE.

    The position comes from a sequence, so its unique index only cost writes; status and
    event type alone select too little to help a list sorted by creation time. The console's
    topic index, created by 0003 in SQL, joins the model's state (and is created where an
    earlier 0003 did not).
    """

    dependencies = [("outbox", "0004_queue_storage")]

    operations = [
        migrations.AlterField(
            model_name="outboxevent",
            name="position",
            field=models.BigIntegerField(
                db_default=models.Func(
                    models.Value("outbox_event_position_seq"), function="nextval"
                ),
                editable=False,
            ),
        ),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_status_idx"),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_type_idx"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="outboxevent",
                    index=models.Index(
                        fields=["topic", "status", "created_at"],
                        name="outbox_event_console_topic_idx",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "CREATE INDEX IF NOT EXISTS outbox_event_console_topic_idx "
                    "ON outbox_event (topic, status, created_at)",
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
        ),
    ]
