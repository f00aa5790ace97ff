"""Every scenario of scenarios/definitions.py at a small N on the isolated 3-broker cluster:
each must end with 0 lost, 0 duplicate effects, 0 order inversions and nothing stuck, after
its faults really happened: each test checks facts that would be false without them (a pid
that changed, leadership that moved, a recovery PostgreSQL logged, processes that ran).
`make scenarios` runs the same at full size."""

import itertools

import pytest

from scenarios.definitions import (
    ACL_DENIED_EVENTS_PER_KEY,
    ACL_DENIED_KEYS,
    ACL_DENIED_LAG_P99_SECONDS,
    CONCURRENT,
    CONSUMER_KILLS_SMALL,
    FAILOVER_DELIVERY_BOUND_SECONDS,
    FAILOVER_FAULTS,
    IDLE_SAMPLES,
    LATE_LOCK_KEYS,
    LEADER_KILL_SMALL_ROUNDS,
    MISSING_TOPIC_EVENTS_PER_KEY,
    MISSING_TOPIC_KEYS,
    MISSING_TOPIC_LAG_P99_SECONDS,
    NUDGE_LAG_P99_SECONDS,
    NUDGE_PATH_RELAY_INTERVAL_SECONDS,
    NUDGE_WORKER_KILLS,
    POOLED_RELAY_KILLS,
    QUIET_BULK_REPLAYS,
    QUIET_REPLAYS,
    RELAY_KILLS_SMALL,
    REPLAY_BOUND_SECONDS,
    WORKER_PROCESSES,
)
from tests.scenarios.conftest import TEST_EVENTS
from tests.scenarios.limits import TEST_TIMEOUT_SECONDS

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(TEST_TIMEOUT_SECONDS)]


def _passes(result: dict, output: str) -> None:
    assert result["complete"], output
    assert result["lost"] == 0, output
    assert result["duplicate_effects"] == 0, output
    assert result["inversions"] == 0, output
    assert result["stuck"] == 0, output
    assert result["passed"], output


def _faults_struck_events_on_their_way(result: dict) -> None:
    # Events written before a fault ended and applied after it began: the faults met traffic
    # in the pipeline, not an idle system (events written later are not counted).
    assert sum(result["extra"]["in_flight_at_faults"]) > 0, result["extra"]["fault_log"]


def _faults_seen(result: dict, count: int) -> None:
    # The result counts the faults whose effect the schedule saw (a process ended by the
    # SIGKILL, leadership moved off a broker, Redis refusing connections, a recovery logged);
    # a fault without it fails the run.
    assert result["extra"]["faults_not_seen"] == [], result["extra"]["fault_log"]
    assert result["faults"] == count, result["extra"]["fault_log"]


def test_baseline(scenario_run):
    code, output, result = scenario_run("baseline")
    assert code == 0, output
    _passes(result, output)
    assert result["report"]["log_duplicates"] == 0  # no fault, no re-send


def test_relay_killed_every_2_to_5_seconds(scenario_run):
    code, output, result = scenario_run("relay-kill")
    assert code == 0, output
    _passes(result, output)
    assert result["extra"]["kills"].get("relay-1", 0) >= RELAY_KILLS_SMALL
    # A new process after each.
    assert len(set(result["extra"]["pids"]["relay-1"])) >= RELAY_KILLS_SMALL + 1
    _faults_seen(result, RELAY_KILLS_SMALL)
    _faults_struck_events_on_their_way(result)


def test_consumers_killed_every_3_seconds(scenario_run):
    code, output, result = scenario_run("consumer-kill")
    assert code == 0, output
    _passes(result, output)
    assert sum(result["extra"]["kills"].values()) == CONSUMER_KILLS_SMALL
    _faults_seen(result, CONSUMER_KILLS_SMALL)
    _faults_struck_events_on_their_way(result)


def test_database_sessions_terminated_every_3_seconds(scenario_run):
    # pg_terminate_backend of the relay's and the consumers' sessions, found by the
    # application_name the runner gives each process: every round ended some.
    code, output, result = scenario_run("db-session-kill")
    assert code == 0, output
    _passes(result, output)
    rounds = result["extra"]["sessions_terminated"]
    assert len(rounds) == 15
    assert all(rounds), rounds
    ended = {name for names in rounds for name in names}
    assert any(name.startswith("scenario-relay-") for name in ended), ended
    assert any(name.startswith("scenario-consumer-") for name in ended), ended
    _faults_seen(result, 15)


def test_handler_failures_keep_the_order_of_each_key(scenario_run):
    # Ordering "key": a failed first attempt holds its key; the events behind it are parked
    # and run after it by the retry task (Celery beat and a worker), while consumers die.
    code, output, result = scenario_run("handler-failures")
    assert code == 0, output
    _passes(result, output)
    assert sum(result["extra"]["kills"].values()) == 15
    assert result["extra"]["handler_failures"] > 0, result["extra"]
    _faults_seen(result, 15)


def test_poison_records_are_quarantined_and_the_rest_flows(scenario_run):
    code, output, result = scenario_run("poison")
    assert code == 0, output
    _passes(result, output)
    assert result["extra"]["poison_records"] == 100
    assert result["extra"]["poison_failed_rows"] == 100
    assert result["report"]["log_foreign"] == 100


def test_partition_leader_killed_and_restarted_3_rounds(scenario_run):
    code, output, result = scenario_run("leader-kill")
    assert code == 0, output
    _passes(result, output)
    rounds = result["extra"]["leader_kills"]
    assert len(rounds) == LEADER_KILL_SMALL_ROUNDS, rounds
    assert len({r["partition"] for r in rounds}) == LEADER_KILL_SMALL_ROUNDS
    for kill in rounds:
        assert kill["broker"] in (1, 2, 3), kill
        # Another process after the restart, and while the broker was down another broker
        # led its partition: it had really died.
        assert kill["restarted_pid"] != kill["killed_pid"], kill
        assert kill["leader_while_down"] not in (None, -1, kill["broker"]), kill
    _faults_seen(result, LEADER_KILL_SMALL_ROUNDS)


def test_clean_rolling_restart(scenario_run):
    code, output, result = scenario_run("rolling-restart")
    assert code == 0, output
    _passes(result, output)
    restarts = result["extra"]["restarts"]
    assert [r["broker"] for r in restarts] == [1, 2, 3], restarts
    for restart in restarts:
        assert restart["started_pid"] != restart["stopped_pid"], restart
        assert not restart["forced"], restart  # SIGTERM alone ended it: a controlled shutdown
        leaders = restart["leaders_while_down"]
        assert leaders, restart
        assert restart["broker"] not in leaders.values(), restart
    _faults_seen(result, 3)


def test_two_brokers_down_for_40_seconds(scenario_run):
    code, output, result = scenario_run("two-brokers-down")
    assert code == 0, output
    _passes(result, output)
    # Events waited through the outage, and none was marked DONE while only one broker (of
    # min.insync.replicas=2) was up.
    assert result["extra"]["pending_at_outage_end"] > 0
    assert result["extra"]["done_during_outage"] == 0
    assert result["extra"]["done_after_outage"] > 0
    _faults_seen(result, 2)


def test_broker_paused_for_40_seconds(scenario_run):
    code, output, result = scenario_run("broker-pause")
    assert code == 0, output
    _passes(result, output)
    # While it was stopped the controller fenced it: another broker led partition 0.
    pause = result["extra"]["pause"]
    assert pause["leader_while_paused"] not in (None, -1, pause["broker"]), pause
    _faults_seen(result, 1)


def test_three_relays_and_two_beat_schedulers(scenario_run):
    code, output, result = scenario_run("concurrent-relays")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    # Each ran from the start to the end, never restarted.
    assert {name: extra["starts"].get(name) for name in CONCURRENT} == dict.fromkeys(CONCURRENT, 1)
    seen = extra["concurrent"]
    for relay in ("relay-1", "relay-2", "relay-3"):
        assert seen[relay]["started"] == 1, seen
        assert seen[relay]["published"] > 0, seen
    for beat in ("beat-1", "beat-2"):
        assert seen[beat]["sent"] > 0, seen
    assert seen["worker-1"]["relay_tasks"] > 0, seen
    _faults_seen(result, 1)


def test_rebalance_storm(scenario_run):
    code, output, result = scenario_run("rebalance-storm")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    assert sum("joins" in line for line in extra["fault_log"]) >= 5
    # Joining consumers were members of the group and applied events.
    assert extra["most_dynamic_members"] >= 1, extra["group_members"]
    assert extra["dynamic_consumers_applying"], extra["effects_by_process"]
    assert extra["group_types"] == ["classic"], extra
    _faults_seen(result, 20)
    _faults_struck_events_on_their_way(result)


def test_consumers_joining_and_leaving_under_the_consumer_group_protocol(scenario_run):
    # The same storm with INBOX_GROUP_PROTOCOL=consumer (KIP-848): the broker assigns
    # partitions, incrementally, and the coordinator reports the group as a consumer group.
    code, output, result = scenario_run("rebalance-storm-kip848")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    assert extra["group_types"] == ["consumer"], extra
    assert extra["most_dynamic_members"] >= 1, extra["group_members"]
    assert extra["dynamic_consumers_applying"], extra["effects_by_process"]
    _faults_seen(result, 20)
    _faults_struck_events_on_their_way(result)


def test_postgres_crashed_three_times(scenario_run):
    code, output, result = scenario_run("postgres-crash")
    assert code == 0, output
    _passes(result, output)
    crashes = result["extra"]["postgres_crashes"]
    assert len(crashes) == 3, crashes
    for crash in crashes:
        # A new postmaster each time, which recovered from the WAL: the shutdown was a crash.
        assert crash["started_pid"] != crash["crashed_pid"], crash
        assert crash["recovered"], crash
    for before, after in itertools.pairwise(crashes):
        assert after["crashed_pid"] == before["started_pid"], crashes
    _faults_seen(result, 3)


def test_celery_worker_killed_and_redis_restarted(scenario_run):
    code, output, result = scenario_run("celery-redis")
    assert code == 0, output
    _passes(result, output)
    assert result["extra"]["kills"]["worker-1"] == 3
    # Redis refused connections when it had just stopped and just before it started again.
    assert result["extra"]["redis_refused"] == [True, True]
    for killed in result["extra"]["killed"]["worker-1"]:
        # The worker with its pool; the signal reached each of its processes (none was alive
        # and untouched when the worker itself had died), and none outlived it.
        assert len(killed["group"]) >= WORKER_PROCESSES, killed
        assert killed["spared"] == [], killed
        assert killed["survivors"] == [], killed
    _faults_seen(result, 4)


def test_event_log_relay_under_a_held_snapshot_and_a_pg_dump(scenario_run):
    code, output, result = scenario_run("long-snapshot")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    # The transaction held its snapshot (its xmin) from open to close, and pg_dump ran then.
    assert extra["snapshot"]["opened"]["xmin"] is not None
    assert extra["snapshot"]["closed"]["xmin"] == extra["snapshot"]["opened"]["xmin"]
    assert extra["snapshot"]["dump_bytes"] > 0
    assert extra["published_while_held"] > 0
    assert extra["event_updates"] == 0
    # The open and the dump; the close checks that the snapshot held.
    _faults_seen(result, 2)
    assert extra["checks_seen"] == 1


def test_event_log_relay_on_four_hot_keys_killed_5_times(scenario_run):
    code, output, result = scenario_run("hot-keys")
    assert code == 0, output
    _passes(result, output)
    assert result["keys"] == 4
    assert result["extra"]["kills"].get("relay-1", 0) == 5
    _faults_seen(result, 5)


def test_event_log_relays_take_over_from_a_killed_shard_owner(scenario_run):
    code, output, result = scenario_run("relay-takeover")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    assert None not in extra["shard_owners_killed"], extra["shard_owners_killed"]
    assert sum(extra["kills"].values()) == 8
    assert extra["publishing_relays"] == ["relay-1", "relay-2"]
    _faults_seen(result, 8)


def test_an_event_refused_once_holds_its_key_until_its_retry_delivers_it(scenario_run):
    # The producer refuses one event the first time: the relay holds its key, tries the event
    # again after its backoff, and the key's later events follow it in order. The same run
    # with a relay that never retries is broken-log-relay-no-retry.
    code, output, result = scenario_run("refused-event")
    assert code == 0, output
    _passes(result, output)
    assert result["keys"] == 20
    failures = result["extra"]["refused_event_failures"]
    assert len(failures) == 1, failures
    assert failures[0].startswith("REFUSED"), failures


def test_relay_by_on_commit_nudges_alone_through_a_killed_celery_worker(scenario_run):
    # No outbox_relay, beat's relay tick every 60 s: the events go out within the lag only
    # because each committed transaction nudges the worker through Redis. The worker is
    # SIGKILLed while a relay task holds the shards, restarted, and nothing is lost.
    code, output, result = scenario_run("nudge-path")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    assert extra["nudge"]["on_commit"] is True
    assert extra["nudge"]["beat_relay_interval_seconds"] == NUDGE_PATH_RELAY_INTERVAL_SECONDS
    assert not any(name.startswith("relay-") for name in extra["pids"]), extra["pids"]
    assert extra["kills"]["worker-1"] == NUDGE_WORKER_KILLS
    for killed in extra["killed"]["worker-1"]:
        assert killed["returncode"] == -9, killed
        assert killed["aimed"] is True, killed  # a relay task held the shards at the signal
    lag = extra["publish_lag"]
    assert lag["all"]["events"] == result["events"]
    assert lag["outside_worker_outages"]["p99_ms"] <= NUDGE_LAG_P99_SECONDS * 1000, lag
    assert extra["relay_tasks"]["succeeded"] > extra["relay_tasks"]["beat_ticks_sent"]
    _faults_seen(result, NUDGE_WORKER_KILLS)


def test_a_transaction_idle_in_transaction_holding_its_snapshot_and_transaction_id(scenario_run):
    # A REPEATABLE READ transaction idle after a read and pg_current_xact_id() holds its
    # backend_xmin and backend_xid while events flow and retention runs: the event table gets
    # no dead tuple, the relay's batch read stays bounded though every tick starts at the held
    # transaction id, and retention drops a day partition meanwhile.
    code, output, result = scenario_run("idle-transaction")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    samples = extra["idle_samples"]
    assert len(samples) == IDLE_SAMPLES
    xmin, xid = extra["snapshot"]["opened"]["xmin"], extra["snapshot"]["opened"]["xid"]
    assert xmin is not None
    assert xid is not None  # it holds a transaction id, as a writer would
    for sample in samples:
        assert (sample["state"], sample["xmin"], sample["xid"]) == (
            "idle in transaction",
            xmin,
            xid,
        ), sample
        # Every tick the relay took meanwhile starts at or below the held transaction id.
        assert int(sample["tick_xmin"]) <= int(xid), sample
        assert sample["table"]["dead_tuples"] == 0, sample
    assert (extra["snapshot"]["closed"]["xmin"], extra["snapshot"]["closed"]["xid"]) == (xmin, xid)
    assert extra["published_while_held"] > 0
    assert extra["old_day"]["dropped_at_samples"], extra["old_day"]
    # The open; every sample and the close check that it held.
    _faults_seen(result, 1)
    assert extra["checks_seen"] == IDLE_SAMPLES + 1


def test_writers_that_take_their_transaction_id_before_the_aggregate_s_lock(scenario_run):
    # 12 writers on 6 aggregates, each taking its transaction id, then the aggregate's lock:
    # on a key, transaction-id order is not version order. Kafka's order per key is.
    code, output, result = scenario_run("late-lock-writers", events=1000)
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    assert result["keys"] == LATE_LOCK_KEYS
    assert sum(extra["aggregate_versions"].values()) == result["events"]
    versions = extra["version_order"]
    assert versions["log_complete"], versions
    assert (versions["keys"], versions["records"]) == (LATE_LOCK_KEYS, result["events"])
    assert (versions["inversions"], versions["gaps"]) == (0, 0), versions
    # What the run is about happened: writers of a key committed between the same two ticks
    # in the other order than their transaction ids'.
    assert extra["late_lock"]["late_lockers_in_one_span"] > 0, extra["late_lock"]


def test_an_operator_s_replay_in_a_quiet_database_goes_out_within_seconds(scenario_run):
    # Once every event is delivered and the relay has taken no tick for 2 s, delivered events
    # are replayed with their own ids through the repairs service, one at a time, then in one
    # bulk: each is published again, and the inbox counts the copy as a duplicate.
    code, output, result = scenario_run("quiet-replay")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    assert extra["quiet"]["quiet"], extra["quiet"]
    replays = extra["replays"]
    assert len(replays) == QUIET_REPLAYS + 1
    assert sum(len(replay["events"]) for replay in replays) == QUIET_REPLAYS + QUIET_BULK_REPLAYS
    for replay in replays:
        # The replay held its events (read back in its own transaction) ...
        assert replay["replayed"] == replay["held"] == len(replay["events"]), replay
        # ... and each went out again within the bound.
        delays = replay["delays"].values()
        assert all(d is not None and d <= REPLAY_BOUND_SECONDS for d in delays), replay
    # Nothing but the replays could wake the relay: no event row was written meanwhile.
    assert extra["event_rows_written_after_quiet"] == 0
    copies = extra["replay_copies_in_log"]
    assert len(copies) == QUIET_REPLAYS + QUIET_BULK_REPLAYS
    assert set(copies.values()) == {2}, copies
    assert result["report"]["log_duplicates"] == QUIET_REPLAYS + QUIET_BULK_REPLAYS
    assert all(count >= 1 for count in extra["duplicate_counts"].values()), extra
    # The replays; the quiet moment, each wait for the copies and the inbox's count are checks.
    _faults_seen(result, QUIET_REPLAYS + 1)
    assert extra["checks_seen"] == QUIET_REPLAYS + 3


def test_events_on_a_missing_topic_hold_their_keys_and_the_rest_flows(scenario_run):
    # The relay's producer asks for no topic on demand. Events on a topic that does not exist
    # hold their keys (each key's first event failed with UNKNOWN_TOPIC, and no failure was
    # taken for a Kafka outage) while the run's own events flow; once the topic is created and
    # the held events are retried through the repairs service, they all arrive in order.
    code, output, result = scenario_run("missing-topic")
    assert code == 0, output
    _passes(result, output)
    state = result["extra"]["missing_topic"]
    held = state["held"]
    assert held["held"] == held["events"] == MISSING_TOPIC_KEYS * MISSING_TOPIC_EVENTS_PER_KEY
    assert len(held["heads"]) == MISSING_TOPIC_KEYS
    for head in held["heads"].values():
        assert head["first_event"], head
        assert head["attempts"] >= 1, head
        assert head["failed_records"] == head["attempts"], head
        assert "UNKNOWN_TOPIC" in head["last_error"], head
    assert held["published"] == 0
    assert not held["topic_exists"]
    lag = state["publish_lag"]
    assert lag["events"] == result["events"]
    assert lag["p99_ms"] <= MISSING_TOPIC_LAG_P99_SECONDS * 1000, lag
    assert state["retried"] > 0
    after = state["after_retry"]
    assert after["log_records"] >= after["events"] == held["events"], after
    assert after["problems"] == [], after
    # The topic's creation and the retry; the flow, the held events and their arrival are
    # checks.
    _faults_seen(result, 2)
    assert result["extra"]["checks_seen"] == 3


def test_a_topic_the_relay_may_no_longer_write_holds_its_keys_and_the_rest_flows(scenario_run):
    # Every process on Kafka's secured listener as a user of its own. The relay's user loses
    # WRITE on one topic while events flow to it and to the run's topic: each of its keys is
    # held with the authorizer's refusal (as the console lists held keys), the run's events
    # are published meanwhile; once the permission is back the relay's own retries send the
    # held events, all in the topic's log in order.
    code, output, result = scenario_run("acl-denied")
    assert code == 0, output
    _passes(result, output)
    state = result["extra"]["acl_denied"]
    held = state["held"]
    assert held["refused"] == len(held["heads"]) == ACL_DENIED_KEYS, held
    for head in held["heads"].values():
        assert head["attempts"] >= 1, head
        assert "TOPIC_AUTHORIZATION_FAILED" in head["error"], head
    assert held["run_topic_published_since"] > 0, held
    lag = state["publish_lag"]
    assert lag["events"] == result["events"]
    assert lag["p99_ms"] <= ACL_DENIED_LAG_P99_SECONDS * 1000, lag
    after = state["after_restore"]
    assert after["events"] == ACL_DENIED_KEYS * ACL_DENIED_EVENTS_PER_KEY, after
    assert after["log_records"] >= after["events"], after
    assert after["problems"] == [], after
    # The permission taken and given back; the first events, the held keys and the arrival
    # are checks.
    _faults_seen(result, 2)
    assert result["extra"]["checks_seen"] == 3


def test_a_relay_through_a_session_pool_killed_10_times_and_consumers_through_a_transaction_pool(
    scenario_run,
):
    code, output, result = scenario_run("pooled-connections")
    assert code == 0, output
    _passes(result, output)
    extra = result["extra"]
    # A new relay process after each kill, each with server sessions through the pooler; at
    # least one got the reset session of the relay it replaced (the same server process).
    assert len(set(extra["pids"]["relay-1"])) >= POOLED_RELAY_KILLS + 1
    assert len(extra["relay_server_sessions"]) == POOLED_RELAY_KILLS
    assert all(extra["relay_server_sessions"])
    assert extra["relay_server_sessions_reused"] >= 1
    assert extra["transaction_pool_transactions"] > 0
    _faults_seen(result, POOLED_RELAY_KILLS)
    _faults_struck_events_on_their_way(result)


def _failed_over(result: dict) -> None:
    extra = result["extra"]
    _faults_seen(result, FAILOVER_FAULTS)
    # Each promotion started a new timeline: the standby's, then the first server's again.
    first, promoted, back = extra["timelines"]
    assert first < promoted < back, extra["timelines"]
    assert extra["standby_behind_bytes"] > 0
    assert extra["promotion_to_first_delivery_seconds"] <= FAILOVER_DELIVERY_BOUND_SECONDS
    _faults_struck_events_on_their_way(result)


def test_primary_failover_with_synchronous_replication_loses_nothing(scenario_run):
    code, output, result = scenario_run("primary-failover")
    assert code == 0, output
    _passes(result, output)
    _failed_over(result)
    extra = result["extra"]
    # Commits waited for the standby when the primary died: none of them returned, none was
    # sent, and every event a writer saw committed is on the new primary.
    assert extra["commits_waiting_for_standby"] > 0, extra["fault_log"]
    assert extra["committed_events_missing"] == 0
    assert result["report"]["log_unreplicated"] == 0
    assert result["report"]["events"] == TEST_EVENTS


def test_primary_failover_with_asynchronous_replication_counts_what_the_standby_missed(
    scenario_run,
):
    code, output, result = scenario_run("primary-failover-async")
    assert code == 0, output
    _passes(result, output)
    _failed_over(result)
    extra = result["extra"]
    # The same fault loses commits here: writers saw them return, the new primary lacks them;
    # what the relay had sent of them is counted apart. Every event it holds was delivered.
    assert extra["committed_events_missing"] > 0, extra["fault_log"]
    assert result["report"]["events"] == TEST_EVENTS - extra["committed_events_missing"]
