"""The checker can fail: a consumer or relay broken on purpose (scenarios/management/
commands/scenario_broken.py) runs the baseline on the isolated cluster, and the delivery check
reports exactly the loss or the duplicates its bug causes."""

import pytest

from scenarios.definitions import REFUSED_EVENT_NUMBER
from tests.scenarios.limits import TEST_TIMEOUT_SECONDS

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(TEST_TIMEOUT_SECONDS)]


def test_offsets_committed_before_the_database_transaction_lose_events(scenario_run):
    # Each consumer commits its batch's offsets, then dies inside the database transaction,
    # twice: those batches are never applied.
    code, output, result = scenario_run("broken-consumer-commit-first", events=1000)
    assert code == 0, output  # exit 0: the scenario failed as expected
    assert not result["passed"]
    assert result["lost"] > 0, output
    assert result["duplicate_effects"] == 0
    assert any("lost events" in problem for problem in result["problems"])
    # An incomplete run says where it stood: here the group committed offsets past records
    # it never applied.
    stall = result["extra"]["stall"]
    positions = [line for line in stall if line.startswith("partition ")]
    assert len(positions) == 6, stall
    assert any(line.startswith("processes down: ") for line in stall), stall
    assert any(line.startswith("member ") for line in stall), stall


def test_a_consumer_without_deduplication_applies_redelivered_events_twice(scenario_run):
    # Killed after the database commit, before the offset commit: the batch comes again,
    # and without the inbox's (group, event id) check its handlers run again.
    code, output, result = scenario_run("broken-no-dedup", events=1000)
    assert code == 0, output
    assert not result["passed"]
    assert result["duplicate_effects"] > 0, output
    assert result["lost"] == 0


def test_an_event_log_cursor_moved_before_the_delivery_report_loses_events(scenario_run):
    # The relay records its batch as delivered (DONE) and moves its cursor, then dies before
    # the records leave its queue.
    code, output, result = scenario_run("broken-log-relay-cursor-first", events=3000)
    assert code == 0, output
    assert not result["passed"]
    assert result["lost"] > 0, output
    assert result["report"]["log_missing"] == result["lost"]
    assert result["stuck"] == 0  # recorded as published: nothing looks stuck


def test_ordering_none_applies_a_failed_event_after_the_later_ones_of_its_key(scenario_run):
    # The handler-failures scenario with ordering "none": a failed event is retried after
    # newer events of its key ran, and the checker reports the inversions.
    code, output, result = scenario_run("broken-ordering-none")
    assert code == 0, output
    assert not result["passed"]
    assert result["extra"]["handler_failures"] > 0, result["extra"]
    assert result["inversions"] > 0, output
    assert result["lost"] == 0
    assert result["duplicate_effects"] == 0


def test_an_event_log_relay_sending_its_batch_in_reverse_inverts_the_order_of_keys(scenario_run):
    # On 20 keys each batch holds several events of a key, and the later reaches Kafka first;
    # the consumers apply them in the log's order. Everything arrives, exactly once.
    code, output, result = scenario_run("broken-log-relay-reversed", events=2000)
    assert code == 0, output
    assert not result["passed"]
    assert result["complete"], output
    report = result["report"]
    assert report["log_inversions"] > 0, output
    assert all(group["effect_inversions"] > 0 for group in report["groups"]), output
    # The inversions, and nothing else, fail it.
    assert result["problems"] == [f"{result['inversions']} order inversions"], output
    assert result["lost"] == 0
    assert result["duplicate_effects"] == 0
    assert result["stuck"] == 0


def test_an_event_log_relay_sending_a_span_in_transaction_id_order_inverts_late_lockers(
    scenario_run,
):
    # Writers that take their transaction id before the aggregate's lock, with a relay that
    # sends each batch by (txid, position): of two writers of a key committed in one span,
    # the later version goes first when its writer took its id first. Everything arrives,
    # exactly once.
    code, output, result = scenario_run("broken-log-relay-txid-order", events=1000)
    assert code == 0, output
    assert not result["passed"]
    assert result["complete"], output
    assert result["extra"]["late_lock"]["late_lockers_in_one_span"] > 0, result["extra"]
    assert result["inversions"] > 0, output
    versions = result["extra"]["version_order"]
    assert versions["inversions"] > 0, versions
    assert result["lost"] == 0
    assert result["duplicate_effects"] == 0
    assert result["stuck"] == 0


def test_an_event_log_relay_that_never_retries_a_held_key_leaves_its_events_stuck(scenario_run):
    # The producer refuses one event once; the relay holds its key, as it should, but never
    # tries it again: that event and the later ones of its key wait for good, the rest flows.
    code, output, result = scenario_run("broken-log-relay-no-retry", events=2000)
    assert code == 0, output
    assert not result["passed"]
    keys, events = result["keys"], result["events"]
    held = [
        n for n in range(REFUSED_EVENT_NUMBER, events) if n % keys == REFUSED_EVENT_NUMBER % keys
    ]
    report = result["report"]
    assert report["stuck_outbox"] == len(held), output
    assert result["stuck"] == len(held)
    # Stuck in the outbox, so never applied: the lost events are exactly the stuck ones.
    assert result["lost"] == len(held), output
    assert report["log_missing"] == 0
    held_key = f"k{REFUSED_EVENT_NUMBER % keys}#"
    stuck_examples = report["examples"]["outbox not DONE"]
    assert all(example.startswith(held_key) for example in stuck_examples), stuck_examples
    assert result["problems"] == [
        "delivery did not complete",
        f"{len(held)} lost events",
        f"{len(held)} rows stuck",
    ], output
    assert result["inversions"] == 0
    assert result["duplicate_effects"] == 0
    # The refusal happened once, and nothing tried the event again.
    assert len(result["extra"]["refused_event_failures"]) == 1, result["extra"]
