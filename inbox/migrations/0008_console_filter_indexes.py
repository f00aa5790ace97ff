# The console's filters by aggregate type, by discard and by error class read the whole table
# when they matched few rows. The last two indexes hold only the rows discarded or with an error.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inbox", "0007_attempts"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="inboxmessage",
            index=models.Index(fields=["aggregate_type"], name="inbox_message_aggtype_idx"),
        ),
        migrations.AddIndex(
            model_name="inboxmessage",
            index=models.Index(
                condition=models.Q(("discarded_at__isnull", False)),
                fields=["discarded_at"],
                name="inbox_message_discarded_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="inboxmessage",
            index=models.Index(
                models.Func(
                    models.Func(
                        models.F("last_error"),
                        models.Value("\n"),
                        models.Value(1),
                        function="split_part",
                    ),
                    models.Value(":"),
                    models.Value(1),
                    function="split_part",
                    output_field=models.CharField(),
                ),
                condition=models.Q(("last_error", ""), _negated=True),
                name="inbox_message_error_class_idx",
            ),
        ),
    ]
