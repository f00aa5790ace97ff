"""Every scenario of scenarios/definitions.py at a small N on the isolated 3-broker cluster:
each must end with 0 lost, 0 duplicate effects, 0 order inversions and nothing stuck, after
its faults really happened. `make scenarios` runs the same at full size."""

import pytest

pytestmark = pytest.mark.kafka


def _passes(result: dict, output: str) -> None:
    assert result["complete"], output
    assert result["lost"] == 0, output
    assert result["duplicate_effects"] == 0, output
    assert result["inversions"] == 0, output
    assert result["stuck"] == 0, output
    assert result["passed"], output
    assert result["seconds_after_last_fault"] is not None


def test_baseline(scenario_run):
    code, output, result = scenario_run("baseline")
    assert code == 0, output
    _passes(result, output)
    assert result["report"]["log_duplicates"] == 0  # no fault, no re-send


def test_relay_killed_every_2_to_5_seconds(scenario_run):
    code, output, result = scenario_run("relay-kill")
    assert code == 0, output
    _passes(result, output)
    assert result["extra"]["kills"]["relay-1"] >= 20


def test_consumers_killed_every_3_seconds(scenario_run):
    code, output, result = scenario_run("consumer-kill")
    assert code == 0, output
    _passes(result, output)
    assert sum(result["extra"]["kills"].values()) == 15


def test_poison_records_are_quarantined_and_the_rest_flows(scenario_run):
    code, output, result = scenario_run("poison")
    assert code == 0, output
    _passes(result, output)
    assert result["extra"]["poison_records"] == 100
    assert result["extra"]["poison_failed_rows"] == 100
    assert result["report"]["log_foreign"] == 100


def test_partition_leader_killed_and_restarted_5_rounds(scenario_run):
    code, output, result = scenario_run("leader-kill")
    assert code == 0, output
    _passes(result, output)
    assert sum("SIGKILL broker" in line for line in result["extra"]["fault_log"]) == 5


def test_clean_rolling_restart(scenario_run):
    code, output, result = scenario_run("rolling-restart")
    assert code == 0, output
    _passes(result, output)
    assert sum("stop broker" in line for line in result["extra"]["fault_log"]) == 3


def test_two_brokers_down_for_60_seconds(scenario_run):
    code, output, result = scenario_run("two-brokers-down")
    assert code == 0, output
    _passes(result, output)
    # Events waited through the outage, and none was marked DONE while only one broker (of
    # min.insync.replicas=2) was up.
    assert result["extra"]["pending_at_outage_end"] > 0
    assert result["extra"]["done_during_outage"] == 0
    assert result["extra"]["done_after_outage"] > 0


def test_broker_paused_for_40_seconds(scenario_run):
    code, output, result = scenario_run("broker-pause")
    assert code == 0, output
    _passes(result, output)


def test_three_relays_and_two_beat_schedulers(scenario_run):
    code, output, result = scenario_run("concurrent-relays")
    assert code == 0, output
    _passes(result, output)
    assert {"relay-1", "relay-2", "relay-3", "beat-1", "beat-2", "worker-1"} <= set(
        result["extra"]["starts"]
    )


def test_rebalance_storm(scenario_run):
    code, output, result = scenario_run("rebalance-storm")
    assert code == 0, output
    _passes(result, output)
    assert sum("joins" in line for line in result["extra"]["fault_log"]) >= 5


def test_postgres_crashed_three_times(scenario_run):
    code, output, result = scenario_run("postgres-crash")
    assert code == 0, output
    _passes(result, output)
    assert sum("immediate shutdown" in line for line in result["extra"]["fault_log"]) == 3


def test_celery_worker_killed_and_redis_restarted(scenario_run):
    code, output, result = scenario_run("celery-redis")
    assert code == 0, output
    _passes(result, output)
    assert result["extra"]["kills"]["worker-1"] == 3
