"""The audit log moves from the outbox app to the console, in Django's state only: the table
outbox_operator_action stays with its rows, and its content type is renamed, so the view
permission and every group or user holding it keep working. The action permissions it used
to carry move, rows and holders, to the models they guard (declared there by outbox 0008 and
inbox 0004): outbox.retry_inboxmessage becomes inbox.retry_inboxmessage for the same groups."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

# The action permissions the audit model carried, and the model each one now lives on.
ACTION_PERMISSIONS = {
    "retry_outboxevent": ("outbox", "outboxevent"),
    "discard_outboxevent": ("outbox", "outboxevent"),
    "replay_outboxevent": ("outbox", "outboxevent"),
    "release_outboxkey": ("outbox", "outboxevent"),
    "retry_inboxmessage": ("inbox", "inboxmessage"),
    "replay_inboxmessage": ("inbox", "inboxmessage"),
    "discard_inboxmessage": ("inbox", "inboxmessage"),
}


def _move_permission(apps, codename, source, target):
    """Gives the permission row `codename` of content type `source` to `target`, keeping its
    id and so its groups and users. Where `target` already has one, the holders move to it."""
    content_types = apps.get_model("contenttypes", "ContentType").objects
    permissions = apps.get_model("auth", "Permission").objects
    moving = permissions.filter(
        content_type__app_label=source[0], content_type__model=source[1], codename=codename
    ).first()
    if moving is None:
        return
    target_type, _ = content_types.get_or_create(app_label=target[0], model=target[1])
    existing = permissions.filter(content_type=target_type, codename=codename).first()
    if existing is None:
        moving.content_type = target_type
        moving.save(update_fields=["content_type"])
        return
    existing.group_set.add(*moving.group_set.all())
    existing.user_set.add(*moving.user_set.all())
    moving.delete()


def forwards(apps, schema_editor):
    content_types = apps.get_model("contenttypes", "ContentType").objects
    if not content_types.filter(app_label="console", model="operatoraction").exists():
        content_types.filter(app_label="outbox", model="operatoraction").update(app_label="console")
    for codename, target in ACTION_PERMISSIONS.items():
        _move_permission(apps, codename, ("console", "operatoraction"), target)


def backwards(apps, schema_editor):
    for codename, target in ACTION_PERMISSIONS.items():
        _move_permission(apps, codename, target, ("console", "operatoraction"))
    content_types = apps.get_model("contenttypes", "ContentType").objects
    if not content_types.filter(app_label="outbox", model="operatoraction").exists():
        content_types.filter(app_label="console", model="operatoraction").update(app_label="outbox")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("outbox", "0007_event_type_index"),
        ("inbox", "0003_search_indexes"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="OperatorAction",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("username", models.CharField(max_length=150)),
                        (
                            "action",
                            models.CharField(
                                choices=[
                                    ("outbox.retry", "Retry outbox events"),
                                    ("outbox.discard", "Discard outbox events"),
                                    ("outbox.replay", "Replay outbox events (same event id)"),
                                    (
                                        "outbox.replay_new_id",
                                        "Replay outbox events (new event id)",
                                    ),
                                    ("outbox.release_key", "Release a quarantined key"),
                                    ("inbox.retry", "Retry inbox messages"),
                                    ("inbox.replay", "Replay inbox messages"),
                                    ("inbox.discard", "Discard inbox messages"),
                                    ("analytics.run", "Start an analytics run"),
                                ],
                                max_length=32,
                            ),
                        ),
                        ("model", models.CharField(max_length=64)),
                        (
                            "source",
                            models.CharField(
                                choices=[("admin", "Admin"), ("api", "API")], max_length=8
                            ),
                        ),
                        ("requested", models.PositiveIntegerField(default=0)),
                        ("changed", models.PositiveIntegerField(default=0)),
                        ("object_ids", models.JSONField(blank=True, default=list)),
                        ("filters", models.JSONField(blank=True, default=dict)),
                        ("note", models.TextField(blank=True, default="")),
                        ("chunks_pending", models.PositiveIntegerField(default=0)),
                        (
                            "user",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "outbox_operator_action",
                        "ordering": ("-created_at",),
                        "default_permissions": ("view",),
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
