"""What the scenario processes share: the event type, and the environment through which the
runner tells its subprocesses which topic and group a run uses."""

import os

EVENT_TYPE = "ScenarioEvent"
AGGREGATE_TYPE = "scenario"
# Set by the runner for the consumers it starts; nothing registers without them.
TOPIC_VARIABLE = "SCENARIO_TOPIC"
GROUP_VARIABLE = "SCENARIO_GROUP"
RUN_VARIABLE = "SCENARIO_RUN"
# The percentage of events whose handler's first attempt fails (handler-failures), chosen by a
# hash of the run and the event id: the same events fail in every process of a run.
FAILURE_PERCENT_VARIABLE = "SCENARIO_FIRST_ATTEMPT_FAILURE_PERCENT"


def handler_target() -> tuple[str, str, str] | None:
    """(topic, group, run) of the scenario handler in this process, or None when the process
    was not started by the scenario runner."""
    topic = os.environ.get(TOPIC_VARIABLE)
    group = os.environ.get(GROUP_VARIABLE)
    if not topic or not group:
        return None
    return topic, group, os.environ.get(RUN_VARIABLE, "")


# The number (payload "n") of the event the relay's producer refuses the first time it sends it
# (scenario_broken's log-relay variants), as it refuses a record it cannot take.
REFUSED_EVENT_VARIABLE = "SCENARIO_REFUSED_EVENT"
