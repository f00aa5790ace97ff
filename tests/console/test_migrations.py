"""The audit log's move from the outbox app to the console keeps what operators already
had: a group given the old permissions (all of them on outbox.OperatorAction, the inbox ones
spelled outbox.retry_inboxmessage and so on) holds the same rights after the migrations, under
the names the code now checks."""

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from console.models import OperatorAction

BEFORE_THE_CONSOLE = [
    ("outbox", "0007_event_type_index"),
    ("inbox", "0003_search_indexes"),
    ("console", None),
]
OLD_PERMISSIONS = (
    "view_operatoraction",
    "retry_outboxevent",
    "discard_outboxevent",
    "replay_outboxevent",
    "release_outboxkey",
    "retry_inboxmessage",
    "replay_inboxmessage",
    "discard_inboxmessage",
)
NEW_PERMISSIONS = {
    "console.view_operatoraction",
    "outbox.retry_outboxevent",
    "outbox.discard_outboxevent",
    "outbox.replay_outboxevent",
    "outbox.release_outboxkey",
    "inbox.retry_inboxmessage",
    "inbox.replay_inboxmessage",
    "inbox.discard_inboxmessage",
}


def migrate(targets: list[tuple[str, str | None]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    ContentType.objects.clear_cache()
    return executor


@pytest.mark.django_db(transaction=True)
def test_a_group_holding_the_old_permissions_holds_the_new_ones_after_the_move():
    executor = migrate(BEFORE_THE_CONSOLE)
    # What a database migrated before the console holds (auth and contenttypes are unchanged).
    audit_type = ContentType.objects.get(app_label="outbox", model="operatoraction")
    permissions = Permission.objects.filter(content_type=audit_type, codename__in=OLD_PERMISSIONS)
    assert permissions.count() == len(OLD_PERMISSIONS)
    group = Group.objects.create(name="on-call")
    group.permissions.set(permissions)
    old = executor.loader.project_state(BEFORE_THE_CONSOLE[:2]).apps
    audit_entry = old.get_model("outbox", "OperatorAction").objects.create(
        username="earlier", action="outbox.retry", model="outbox.OutboxEvent", source="admin"
    )

    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    operator = User.objects.create_user(username="operator")
    operator.groups.add(group)
    assert operator.get_all_permissions() == NEW_PERMISSIONS
    # The table and its rows stay: the console reads the entry written before the move.
    assert OperatorAction.objects.get(pk=audit_entry.pk).username == "earlier"
    assert not ContentType.objects.filter(app_label="outbox", model="operatoraction").exists()
