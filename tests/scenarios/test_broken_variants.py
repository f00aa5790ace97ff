"""The checker can fail: a consumer or relay broken on purpose (scenarios/management/
commands/scenario_broken.py) runs the baseline on the isolated cluster, and the delivery check
reports exactly the loss or the duplicates its bug causes."""

import pytest

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
