"""Analytics knobs: the PySpark job and its schedule."""

from datetime import timedelta

from project.settings.environment import env


def _expected_consumers(value: str) -> dict[str, list[str]]:
    """Parses `KEY=GROUP|GROUP,KEY=GROUP`: KEY is a topic or an event type."""
    expected: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, _, groups = item.partition("=")
        expected[key.strip()] = [group.strip() for group in groups.split("|") if group.strip()]
    return expected


# A DONE event that an expected consumer group has not recorded this long after its
# publication is reported as "not consumed"; a PENDING event older than this as "stuck".
ANALYTICS_CONSUME_SLA = timedelta(seconds=env.int("ANALYTICS_CONSUME_SLA_SECONDS", default=300))
# The consumer groups that must record the events of a topic or of an event type, e.g.
# ANALYTICS_EXPECTED_CONSUMERS="orders=billing|shipping,user.deleted=audit". An event's
# expected groups are those of its topic and of its type together; for an event whose topic
# and type are both unnamed, the groups seen consuming its topic in the window are expected.
ANALYTICS_EXPECTED_CONSUMERS: dict[str, list[str]] = _expected_consumers(
    env.str("ANALYTICS_EXPECTED_CONSUMERS", default="")
)
# Beat runs the job this often, on the last full interval that the SLA has closed.
ANALYTICS_INTERVAL_SECONDS = env.float("ANALYTICS_INTERVAL_SECONDS", default=3600.0)
# Each table is read over JDBC in this many partitions: at most this many connections at once.
ANALYTICS_JDBC_PARTITIONS = env.int("ANALYTICS_JDBC_PARTITIONS", default=4)
# Rows per round trip; PostgreSQL's driver streams with a cursor only when this is set.
ANALYTICS_JDBC_FETCH_SIZE = env.int("ANALYTICS_JDBC_FETCH_SIZE", default=10_000)
# The database alias whose outbox and inbox tables the job reads.
ANALYTICS_SOURCE_DATABASE = env.str("ANALYTICS_SOURCE_DATABASE", default="default")
ANALYTICS_SHUFFLE_PARTITIONS = env.int("ANALYTICS_SHUFFLE_PARTITIONS", default=8)
# percentile_approx's accuracy: the relative error of a percentile's rank is 1/accuracy.
ANALYTICS_PERCENTILE_ACCURACY = env.int("ANALYTICS_PERCENTILE_ACCURACY", default=10_000)
# The batch scan of the Kafka log (re-sent and missing events); off, the other results remain.
ANALYTICS_KAFKA_SCAN = env.bool("ANALYTICS_KAFKA_SCAN", default=True)
ANALYTICS_KAFKA_TIMEOUT_SECONDS = env.float("ANALYTICS_KAFKA_TIMEOUT_SECONDS", default=10.0)
# Findings kept per kind and run; the run's summary still counts all of them.
ANALYTICS_MAX_FINDINGS_PER_KIND = env.int("ANALYTICS_MAX_FINDINGS_PER_KIND", default=10_000)
# A running job writes its run's heartbeat this often; beat's reaper (every
# ANALYTICS_RUN_REAP_INTERVAL_SECONDS) marks FAILED a RUNNING run with none for
# ANALYTICS_RUN_STALE_SECONDS: its worker stopped. Keep the stale time several heartbeats long.
ANALYTICS_RUN_HEARTBEAT_SECONDS = env.float("ANALYTICS_RUN_HEARTBEAT_SECONDS", default=30.0)
ANALYTICS_RUN_STALE_SECONDS = env.float("ANALYTICS_RUN_STALE_SECONDS", default=300.0)
ANALYTICS_RUN_REAP_INTERVAL_SECONDS = env.float("ANALYTICS_RUN_REAP_INTERVAL_SECONDS", default=60.0)
