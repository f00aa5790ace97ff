"""scenarios/checker.py: check() over hand-made rows, no service needed. Each test breaks one
promise and shows the checker reports it, and only it. Last, the outbox rows it checks, as it
reads them from the database."""

from dataclasses import replace

import pytest
from django.utils import timezone

from scenarios.checker import (
    EffectRow,
    InboxRow,
    LogRecord,
    OutboxRow,
    check,
    load_outbox,
    version_check,
)

GROUP = "g"


def _events(count: int, *, keys: int = 2) -> list[OutboxRow]:
    return [
        OutboxRow(event_id=f"e{n}", key=f"k{n % keys}", seq=n // keys, status="DONE")
        for n in range(count)
    ]


def _log(events: list[OutboxRow], *, keys: int = 2) -> list[LogRecord]:
    # One key per partition, in publication order.
    return [
        LogRecord(
            partition=int(e.key[1:]) % keys, offset=n, event_id=e.event_id, key=e.key, seq=e.seq
        )
        for n, e in enumerate(events)
    ]


def _effects(events: list[OutboxRow]) -> list[EffectRow]:
    return [
        EffectRow(id=n, event_id=e.event_id, key=e.key, seq=e.seq) for n, e in enumerate(events)
    ]


def _inbox(events: list[OutboxRow]) -> list[InboxRow]:
    return [InboxRow(event_id=e.event_id, status="DONE") for e in events]


def _check(events, log=None, effects=None, inbox=None, **kwargs):
    return check(
        topic="t",
        outbox=events,
        log=_log(events) if log is None else log,
        inbox={GROUP: _inbox(events) if inbox is None else inbox},
        effects={GROUP: _effects(events) if effects is None else effects},
        **kwargs,
    )


def test_a_clean_run_passes():
    report = _check(_events(10))
    assert report.ok, report.format()
    assert report.problems() == []
    assert (report.events, report.log_records, report.groups[0].effects) == (10, 10, 10)
    assert "result: PASS" in report.format()


def test_an_event_without_an_effect_is_lost():
    events = _events(10)
    report = _check(events, effects=_effects(events[:7] + events[8:]))
    assert not report.ok
    assert report.lost == 1
    assert report.groups[0].examples["lost"] == ["k1#3 (e7)"]
    assert report.problems() == ["1 lost events"]


def test_a_handler_that_ran_twice_is_a_duplicate_effect():
    events = _events(6)
    effects = [*_effects(events), EffectRow(id=99, event_id="e5", key="k1", seq=2)]
    report = _check(events, effects=effects)
    assert (report.duplicate_effects, report.lost, report.inversions) == (1, 0, 0)
    assert not report.ok


def test_duplicates_in_the_log_are_allowed_and_counted():
    events = _events(6)
    log = _log(events)
    # The relay sent e4 (k0#2) again right after it: the next offset of its partition.
    log.append(LogRecord(partition=0, offset=100, event_id="e4", key="k0", seq=2))
    report = _check(events, log=log)
    assert report.ok, report.format()
    assert report.log_duplicates == 1
    assert report.log_inversions == 0


def test_an_event_that_reaches_the_log_after_a_later_one_of_its_key_is_a_log_inversion():
    events = _events(6)
    # k0's events are e0, e2, e4 (seq 0, 1, 2): e2 first reaches the log after e4.
    log = [record for record in _log(events) if record.event_id != "e2"]
    log.append(LogRecord(partition=0, offset=100, event_id="e2", key="k0", seq=1))
    report = _check(events, log=log)
    assert report.log_inversions == 1
    assert report.log_duplicates == 0
    assert not report.ok
    assert report.problems() == ["1 order inversions"]


def test_a_batch_sent_again_after_newer_records_is_replayed_copies_not_an_inversion():
    events = _events(6)
    log = _log(events)
    # A relay died after sending k0's e0, e2, e4 and before recording it; its successor sent
    # them again: 0 1 2 0 1 2. First copies are in order; the copies are duplicates.
    for offset, event in enumerate((e for e in events if e.key == "k0"), start=100):
        log.append(
            LogRecord(partition=0, offset=offset, event_id=event.event_id, key="k0", seq=event.seq)
        )
    report = _check(events, log=log)
    assert report.ok, report.format()
    assert (report.log_duplicates, report.log_replays, report.log_inversions) == (3, 2, 0)
    assert "3 duplicates, of which 2 replayed" in report.format()


def test_effects_applied_out_of_order_are_inversions():
    events = _events(6)
    effects = _effects(events)
    # k0#1 (e2) applied after k0#2 (e4).
    effects[2], effects[4] = (
        EffectRow(id=4, event_id="e2", key="k0", seq=1),
        EffectRow(id=2, event_id="e4", key="k0", seq=2),
    )
    report = _check(events, effects=effects)
    assert report.groups[0].effect_inversions == 1
    assert report.inversions == 1
    assert not report.ok


def test_rows_not_done_at_the_end_are_stuck():
    events = _events(4)
    events[1] = OutboxRow(event_id="e1", key="k1", seq=0, status="PENDING")
    inbox = _inbox(events)
    inbox[2] = InboxRow(event_id="e2", status="FAILED")
    report = _check(events, inbox=inbox)
    assert report.stuck_outbox == 1
    assert report.groups[0].stuck_inbox == 1
    assert report.stuck == 2


def test_a_done_event_missing_from_the_log_is_reported():
    events = _events(4)
    report = _check(events, log=_log(events)[:3])
    assert report.log_missing == 1
    assert not report.ok


def test_poison_records_are_counted_apart_and_are_not_stuck():
    events = _events(4)
    log = [
        *_log(events),
        LogRecord(partition=0, offset=50, event_id=None, key=None, seq=None),
        # An event id no event has, on a value that is no event's payload (not JSON).
        LogRecord(partition=0, offset=51, event_id="garbage", key="k0", seq=None),
    ]
    inbox = [*_inbox(events), InboxRow(event_id="synthetic", status="FAILED")]
    report = _check(events, log=log, inbox=inbox)
    assert report.ok, report.format()
    assert report.log_foreign == 2
    assert report.log_unreplicated == 0
    assert report.groups[0].foreign_inbox == {"FAILED": 1}


def test_records_and_effects_of_events_the_database_lost_fail_unless_allowed():
    # A primary that failed over without its last commits (asynchronous replication): the
    # relay had sent e4 and e5, the new primary holds neither; e4 was applied on it too.
    held = _events(4)
    lost = _events(6)[4:]
    log = _log([*held, *lost])
    effects = _effects([*held, lost[0]])
    strict = _check(held, log=log, effects=effects)
    assert strict.log_unreplicated == 2
    assert strict.unreplicated_effects == 1
    assert strict.log_foreign == 0
    assert strict.groups[0].phantom_effects == 0
    assert not strict.ok
    assert strict.problems() == [
        "2 records of events the database does not hold",
        "1 effects of events the database does not hold",
    ]
    allowed = _check(held, log=log, effects=effects, unreplicated_allowed=True)
    assert allowed.ok, allowed.format()
    assert allowed.log_unreplicated == 2
    assert "2 of events the database does not hold (allowed)" in allowed.format()


def test_a_key_in_two_partitions_is_reported():
    events = _events(4)
    log = _log(events)
    log[3] = LogRecord(partition=0, offset=3, event_id="e3", key="k1", seq=1)
    report = _check(events, log=log)
    assert report.split_keys == 1
    assert not report.ok


def test_an_incomplete_log_read_fails_the_check():
    report = _check(_events(4), log_complete=False)
    assert not report.ok
    assert "could not be read to its end" in report.problems()[0]


def test_each_group_is_checked_on_its_own():
    events = _events(4)
    report = check(
        topic="t",
        outbox=events,
        log=_log(events),
        inbox={"a": _inbox(events), "b": _inbox(events)},
        effects={"a": _effects(events), "b": _effects(events[:2])},
    )
    assert [(g.group, g.lost) for g in report.groups] == [("a", 0), ("b", 2)]


def _versioned(key: str, versions: list[int], *, partition: int = 0) -> list[LogRecord]:
    """A key's records in the log, one per version, in the order given."""
    return [
        LogRecord(
            partition=partition,
            offset=offset,
            event_id=f"{key}v{version}",
            key=key,
            seq=version,
            version=version,
        )
        for offset, version in enumerate(versions)
    ]


def test_each_key_s_versions_in_log_order_pass_the_version_check():
    log = _versioned("a", [1, 2, 3]) + _versioned("b", [1, 2], partition=1)
    report = version_check(log)
    assert report.ok
    assert (report.keys, report.records, report.inversions, report.gaps) == (2, 5, 0, 0)
    assert report.problems() == []


def test_a_later_version_first_in_the_log_is_a_gap_then_an_inversion():
    # v3 went before v2 (two writers of one span sent in transaction-id order).
    report = version_check(_versioned("a", [1, 3, 2, 4]))
    assert (report.inversions, report.gaps) == (1, 1)
    assert report.examples == ["gap: a v3 after v1 at 0:1", "inversion: a v2 after v3 at 0:2"]
    assert report.problems() == [
        "1 version order inversions in the Kafka log",
        "1 versions skipped in the Kafka log",
    ]


def test_a_version_never_in_the_log_is_a_gap():
    report = version_check(_versioned("a", [1, 2, 4]))
    assert (report.inversions, report.gaps) == (0, 1)
    assert not report.ok


def test_copies_sent_again_and_records_without_a_version_are_left_out_of_the_version_check():
    log = _versioned("a", [1, 2, 3])
    # The relay sent the batch again (1 2 3 1 2 3), and a poison record and an event without
    # a version went to the same key.
    log += [replace(record, offset=record.offset + 10) for record in log]
    log.append(LogRecord(partition=0, offset=20, event_id=None, key="a", seq=None))
    log.append(LogRecord(partition=0, offset=21, event_id="x", key="a", seq=0))
    report = version_check(log)
    assert report.ok, report
    assert report.records == 3


@pytest.mark.django_db
def test_the_outbox_rows_are_the_events_with_their_delivery_without_the_discarded():
    import outbox
    from outbox.models import OutboxDelivery

    topic = "scenario.checker.test"
    delivered, discarded, waiting = (
        outbox.publish(
            aggregate_type="t",
            aggregate_id=f"k{n}",
            event_type="E",
            payload={"seq": n},
            topic=topic,
        )
        for n in range(3)
    )
    for event, outcome in (
        (delivered, OutboxDelivery.Outcome.PUBLISHED),
        (discarded, OutboxDelivery.Outcome.DISCARDED),
    ):
        OutboxDelivery.objects.create(
            event_id=event.pk, outcome=outcome, published_at=timezone.now(), relay="test"
        )
    rows = sorted(load_outbox(topic=topic), key=lambda row: row.seq)
    assert rows == [
        OutboxRow(event_id=str(delivered.pk), key="k0", seq=0, status="DONE"),
        OutboxRow(event_id=str(waiting.pk), key="k2", seq=2, status="PENDING"),
    ]
