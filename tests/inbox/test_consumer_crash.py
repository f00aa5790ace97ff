"""inbox/consumer.py killed with SIGKILL at the fault points of inbox/faults.py, in a real
subprocess (tests/inbox/consumer_process.py runs `inbox_consume`), then restarted.

Each scenario puts one event on a one-partition topic, crashes the consumer at a fault point,
restarts it, then publishes a marker event behind the first: once the marker is applied,
the first event's redelivery (if any) has been handled too.
"""

import signal
import uuid

import pytest

from inbox.faults import AFTER_DB_COMMIT, BEFORE_DB_COMMIT
from inbox.models import ConsumerOffset, InboxMessage
from tests.inbox.conftest import effect_counts, wait_for
from tests.inbox.factories import Event, produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def crash_and_restart(
    consumer_process, kafka_topic, *, fault: str, extra_args=(), **env: str
) -> tuple[str, dict[str, int], dict[str, int], str]:
    """Returns the first event's id, the effects after the crash and after the restart, and
    the group."""
    topic, group = kafka_topic(), f"test-crash-{uuid.uuid4().hex[:10]}"
    # Static membership: the restarted consumer takes the killed one's place at once, instead
    # of waiting out its session timeout (45 s by default).
    env = {"INBOX_CONSUMER_CONFIG": f"group.instance.id={group}-member", **env}
    first, marker = Event(event_type="Effect"), Event(event_type="Effect")
    produce(topic, [first])

    crashed = consumer_process(
        group=group, topic=topic, extra_args=list(extra_args), INBOX_FAULT_INJECT=fault, **env
    )
    assert crashed.wait() == -signal.SIGKILL, crashed.output()
    after_crash = effect_counts(group)

    restarted = consumer_process(group=group, topic=topic, extra_args=list(extra_args), **env)
    produce(topic, [marker])
    wait_for(lambda: marker.event_id in effect_counts(group), what="the marker event")
    assert restarted.terminate() == 0, restarted.output()
    after_restart = effect_counts(group)
    assert after_restart[marker.event_id] == 1
    return first.event_id, after_crash, after_restart, group


def test_killed_after_the_database_commit_applies_nothing_twice(
    consumer_process, kafka_topic, effects
):
    first, after_crash, after_restart, group = crash_and_restart(
        consumer_process, kafka_topic, fault=AFTER_DB_COMMIT
    )
    # The crash came after the database commit, before the offset commit: the effect is in.
    assert after_crash == {first: 1}
    # The restarted consumer got the event again and counted it as a duplicate.
    assert after_restart[first] == 1
    row = InboxMessage.objects.get(consumer_group=group, event_id=first)
    assert row.status == InboxMessage.Status.DONE
    assert row.duplicate_count == 1


def test_killed_before_the_database_commit_processes_the_event_after_restart(
    consumer_process, kafka_topic, effects
):
    first, after_crash, after_restart, group = crash_and_restart(
        consumer_process, kafka_topic, fault=BEFORE_DB_COMMIT
    )
    assert after_crash == {}  # the transaction died with the process
    assert after_restart[first] == 1
    row = InboxMessage.objects.get(consumer_group=group, event_id=first)
    assert row.status == InboxMessage.Status.DONE
    assert row.duplicate_count == 0


def test_the_crash_test_catches_offsets_committed_before_the_database_commit(
    consumer_process, kafka_topic, effects
):
    """The test above can fail: with the offsets committed before the database transaction
    (--broken-commit-order), the same crash loses the event, and its assertion
    `after_restart[first] == 1` would raise KeyError."""
    first, after_crash, after_restart, group = crash_and_restart(
        consumer_process, kafka_topic, fault=BEFORE_DB_COMMIT, extra_args=["--broken-commit-order"]
    )
    assert after_crash == {}
    assert first not in after_restart  # lost
    assert not InboxMessage.objects.filter(consumer_group=group, event_id=first).exists()


def test_exactly_once_mode_applies_nothing_twice_without_deduplication(
    consumer_process, kafka_topic, effects
):
    group_env = {"INBOX_DEDUPLICATE": "false"}
    topic_group: dict[str, str] = {}

    def start(**kwargs):  # the group must be in INBOX_EXACTLY_ONCE_GROUPS of the subprocess
        topic_group["group"] = kwargs["group"]
        return consumer_process(**kwargs, INBOX_EXACTLY_ONCE_GROUPS=kwargs["group"])

    first, after_crash, after_restart, group = crash_and_restart(
        start, kafka_topic, fault=AFTER_DB_COMMIT, **group_env
    )
    assert after_crash == {first: 1}
    # The offset stored with the effect made the restarted consumer seek past the event.
    assert after_restart[first] == 1
    assert ConsumerOffset.objects.get(consumer_group=group).next_offset == 2


def test_the_exactly_once_test_catches_a_double_application(consumer_process, kafka_topic, effects):
    """The test above can fail: without exactly-once mode (and with deduplication off, as
    there) the same crash applies the event twice."""
    first, after_crash, after_restart, group = crash_and_restart(
        consumer_process, kafka_topic, fault=AFTER_DB_COMMIT, INBOX_DEDUPLICATE="false"
    )
    assert after_crash == {first: 1}
    assert after_restart[first] == 2
    # Its offset was stored with the effect too (every group's is); only exactly-once mode
    # seeks past it.
    assert ConsumerOffset.objects.get(consumer_group=group).next_offset == 2
