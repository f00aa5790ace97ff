from django.db import migrations


class Migration(migrations.Migration):
    """The action permissions on inbox messages are declared on InboxMessage (they were
    outbox.retry_inboxmessage and so on, on the audit model); console 0001 moved their rows."""

    dependencies = [
        ("inbox", "0003_search_indexes"),
        ("console", "0001_initial"),
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
