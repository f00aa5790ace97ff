class DemoError(Exception):
    code = "demo_error"


class InjectedFailure(DemoError):
    """Raised on purpose by the delivery handler (DEMO_HANDLER_FAILURE_RATE)."""

    code = "injected_failure"
