"""inbox/faults.py: the failure-injection hook is inert unless its variable names a point.

That it does kill the process when set is shown by tests/inbox/test_consumer_crash.py."""

from inbox import faults


def test_fault_points_do_nothing_when_the_variable_is_unset(monkeypatch):
    monkeypatch.delenv(faults.FAULT_ENV_VAR, raising=False)
    for point in faults.POINTS:
        faults.fault_point(point)  # still alive


def test_fault_points_do_nothing_when_another_point_is_named(monkeypatch):
    monkeypatch.setenv(faults.FAULT_ENV_VAR, "somewhere_else")
    for point in faults.POINTS:
        faults.fault_point(point)


def test_the_product_never_sets_the_variable():
    from django.conf import settings

    for module in ("project/settings", "scripts", "inbox"):
        for path in (settings.BASE_DIR / module).rglob("*"):
            if (
                path.is_file()
                and path.suffix in {".py", ".sh", ".env"}
                and path.name != "faults.py"
            ):
                assert faults.FAULT_ENV_VAR not in path.read_text(errors="ignore"), path
