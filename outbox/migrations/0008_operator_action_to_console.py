from django.apps import apps
from django.db import migrations


class Migration(migrations.Migration):
    """The audit log now belongs to the console app (console 0001 took over its table); the
    action permissions on outbox events are declared on OutboxEvent, where console 0001 moved
    their rows."""

    # After the console's move of the rows when the console is installed; a project with the
    # core apps alone has no console to wait for.
    dependencies = [
        ("outbox", "0007_event_type_index"),
        *([("console", "0001_initial")] if apps.is_installed("console") else []),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="outboxevent",
            options={
                "ordering": ("-created_at",),
                "permissions": (
                    ("retry_outboxevent", "Can retry outbox events"),
                    ("discard_outboxevent", "Can discard outbox events"),
                    ("replay_outboxevent", "Can replay outbox events"),
                    ("release_outboxkey", "Can release quarantined outbox keys"),
                ),
            },
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="OperatorAction")],
            database_operations=[],
        ),
    ]
