"""inbox/management/commands/inbox_consume.py"""

import io
import subprocess
import sys
import uuid

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from inbox import handler
from inbox.models import InboxMessage
from inbox.registry import get_registry
from tests.inbox.conftest import effect_counts, wait_for
from tests.inbox.factories import make_events, produce
from tests.inbox.test_consumer import committed_offsets


def test_list_groups_prints_one_group_per_line(inbox_registry):
    for group, event_type in (("delivery", "A"), ("billing", "A"), ("delivery", "B")):
        handler(event_type=event_type, topic="t", group=group)(lambda message: None)
    out = io.StringIO()
    call_command("inbox_consume", "--list-groups", stdout=out)
    assert out.getvalue() == "billing\ndelivery\n"


def test_list_groups_works_from_the_shell():
    # scripts/run.sh starts one consumer per line of this output: the groups of the handlers
    # in installed apps' handlers.py (the demo's, when it is installed).
    result = subprocess.run(
        [sys.executable, "manage.py", "inbox_consume", "--list-groups"],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout.splitlines() == get_registry().groups()


def test_a_group_is_required(inbox_registry):
    with pytest.raises(CommandError, match="--group"):
        call_command("inbox_consume")


def test_a_group_without_handlers_or_topics_is_an_error(inbox_registry):
    with pytest.raises(CommandError, match="no handlers"):
        call_command("inbox_consume", "--group", "nobody")


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_sigterm_finishes_commits_and_exits_cleanly(consumer_process, kafka_topic, effects):
    topic, group = kafka_topic(), f"test-cmd-{uuid.uuid4().hex[:10]}"
    events = make_events(20, event_type="Effect")
    produce(topic, events)
    process = consumer_process(group=group, topic=topic)
    wait_for(lambda: len(effect_counts(group)) == 20, what="all events")
    assert process.terminate() == 0
    assert "Inbox consumer for group" in process.output()
    assert f"Inbox consumer for group {group} stopped." in process.output()
    assert committed_offsets(group, topic) == [20]
    assert InboxMessage.objects.filter(consumer_group=group, status="DONE").count() == 20
