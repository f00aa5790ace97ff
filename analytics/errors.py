class AnalyticsError(Exception):
    """Base of the analytics errors; `code` names the error for the API."""

    code = "analytics_error"


class SparkJarsMissing(AnalyticsError):
    code = "spark_jars_missing"


class InvalidWindow(AnalyticsError):
    code = "invalid_window"


class SourceUnreachable(AnalyticsError):
    """The database or the Kafka broker that the job reads did not answer."""

    code = "source_unreachable"


class RunNoLongerRunning(AnalyticsError):
    """The run was marked finished while its job still ran (the reaper took its worker for
    dead): the job's results are not stored over that."""

    code = "run_no_longer_running"
