"""How long a scenario test may take, from the inside out: the runner gives up on delivery
first (and still writes its JSON, with where it stood), the subprocess that runs it is killed
next, pytest's timeout comes last. Each bound is above the one inside it."""

from scenarios.runner import COMPLETION_TIMEOUT_SECONDS, STOP_TIMEOUT_SECONDS

# The isolated services' `up` and `down`: the session fixture, inside the first and the last
# scenario test's time.
SERVICES_UP_SECONDS = 900
SERVICES_DOWN_SECONDS = 300
# The writing and the fault schedule, which the runner does not bound: the longest
# (leader-kill) takes about 2 minutes; each of its waits for a broker is bounded.
SCHEDULE_SECONDS = 600
# Migrating and creating the topic, stopping up to a dozen processes, the delivery check.
OVERHEAD_SECONDS = 120 + 10 * STOP_TIMEOUT_SECONDS
# The subprocess `manage.py scenario_run NAME`.
RUN_TIMEOUT_SECONDS = COMPLETION_TIMEOUT_SECONDS + SCHEDULE_SECONDS + OVERHEAD_SECONDS
# pytest-timeout's mark on every scenario test (pyproject's default, 600 s, is too short).
TEST_TIMEOUT_SECONDS = SERVICES_UP_SECONDS + RUN_TIMEOUT_SECONDS + SERVICES_DOWN_SECONDS + 60
