from django.apps import apps
from django.db import migrations


class Migration(migrations.Migration):
    """The action permissions on inbox messages are declared on InboxMessage (they were
    outbox.retry_inboxmessage and so on, on the audit model); console 0001 moved their rows."""

    # After the console's move of the rows when the console is installed; a project with the
    # core apps alone has no console to wait for.
    dependencies = [
        ("inbox", "0003_search_indexes"),
        *([("console", "0001_initial")] if apps.is_installed("console") else []),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="inboxmessage",
            options={
                "ordering": ("-received_at",),
                "permissions": (
                    ("retry_inboxmessage", "Can retry inbox messages"),
                    ("replay_inboxmessage", "Can replay inbox messages"),
                    ("discard_inboxmessage", "Can discard inbox messages"),
                ),
            },
        ),
    ]
