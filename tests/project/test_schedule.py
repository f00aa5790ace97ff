"""The beat schedule: the package's helpers (outbox/beat.py, inbox/beat.py) give every
periodic task the core apps need, each naming a task a worker has registered, and this
project's CELERY_BEAT_SCHEDULE is built from them as a user's project would build it, with the
project's own entries."""

from django.conf import settings

from inbox.beat import inbox_beat_schedule
from inbox.conf import inbox_settings
from outbox.beat import outbox_beat_schedule
from outbox.conf import outbox_settings
from project.celery import app
from project.settings.inbox import INBOX
from project.settings.outbox import OUTBOX


def _registered_tasks() -> set[str]:
    # What a worker of this Celery app registers: the tasks of every installed app.
    app.loader.import_default_modules()
    app.autodiscover_tasks(lambda: settings.INSTALLED_APPS, force=True)
    return set(app.tasks)


def test_every_entry_names_a_registered_task_under_its_stable_name():
    entries = {**outbox_beat_schedule(), **inbox_beat_schedule()}
    assert {key: entry["task"] for key, entry in entries.items()} == {
        "outbox-relay": "outbox.tasks.relay",
        "outbox-purge-published": "outbox.tasks.purge_published",
        "inbox-retry-due": "inbox.tasks.retry_due",
        "inbox-purge-processed": "inbox.tasks.purge_processed",
    }
    assert {entry["task"] for entry in entries.values()} <= _registered_tasks()


def test_the_intervals_follow_the_dicts_and_fall_back_on_the_apps_defaults():
    defaults = {**outbox_beat_schedule({}), **inbox_beat_schedule({})}
    assert defaults["outbox-relay"]["schedule"] == outbox_settings.defaults["RELAY_INTERVAL"]
    assert defaults["inbox-retry-due"]["schedule"] == inbox_settings.defaults["RETRY_INTERVAL"]
    given = {
        **outbox_beat_schedule({"RELAY_INTERVAL": 4}),
        **inbox_beat_schedule({"RETRY_INTERVAL": 30}),
    }
    assert given["outbox-relay"]["schedule"] == 4.0
    # A relay tick queued behind busy workers expires after three intervals.
    assert given["outbox-relay"]["options"] == {"expires": 12.0}
    assert given["inbox-retry-due"]["schedule"] == 30.0


def test_the_projects_schedule_is_the_helpers_entries_its_analytics_run_and_bulk_reaper():
    expected = {**outbox_beat_schedule(OUTBOX), **inbox_beat_schedule(INBOX)}
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert {key: schedule[key] for key in expected} == expected
    own = {"analytics-run", "analytics-reap-runs", "console-reap-bulk-operations"}
    assert set(schedule) - set(expected) == own
    assert schedule["analytics-reap-runs"]["task"] == "analytics.tasks.reap_runs"
    assert schedule["console-reap-bulk-operations"]["task"] == "console.reap_bulk_operations"
    assert {schedule[key]["task"] for key in own} <= _registered_tasks()
