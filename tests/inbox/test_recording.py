"""inbox/services/recording.py and handler_runs.py against PostgreSQL, with records built
in memory."""

import datetime as dt
import time
import uuid

import pytest
from django.db import transaction
from django.utils import timezone

from inbox import handler
from inbox.errors import ImproperlyConfiguredInbox, InvalidTransition, PositionGap
from inbox.models import ConsumerOffset, InboxMessage
from inbox.services.recording import inbox_message_record_batch, retry_delay_seconds
from inbox.services.retries import inbox_messages_retry_due
from tests.app_settings import override_app_settings
from tests.conftest import connect_outside_django
from tests.inbox.conftest import GROUP, effect_counts, record_batch, record_effect, records
from tests.inbox.factories import Event

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_recording_requires_a_transaction(applied):
    with pytest.raises(InvalidTransition):
        inbox_message_record_batch(group=GROUP, records=[])


def test_new_events_run_and_duplicates_are_counted(applied):
    a, b = Event(), Event()
    result = record_batch(records([a, b]))
    assert (result.inserted, result.processed, result.duplicates) == (2, 2, 0)
    result = record_batch(records([a, a, b], start=2))
    assert (result.inserted, result.processed, result.duplicates) == (0, 0, 3)
    assert effect_counts(GROUP) == {a.event_id: 1, b.event_id: 1}
    assert InboxMessage.objects.get(event_id=a.event_id).duplicate_count == 2


def test_a_failing_handler_rolls_back_its_savepoint_and_schedules_a_retry(applied):
    bad, good = Event(), Event()
    applied["raise_for"] = {bad.event_id}
    before = timezone.now()
    result = record_batch(records([bad, good]))
    assert (result.processed, result.failed) == (1, 1)
    assert effect_counts(GROUP) == {good.event_id: 1}  # bad's effect rolled back
    row = InboxMessage.objects.get(event_id=bad.event_id)
    assert row.status == InboxMessage.Status.PENDING
    assert row.attempts == 1
    assert row.last_error.startswith("builtins.ValueError: cannot apply")
    assert "Traceback" not in row.last_error
    assert "line " in row.last_error
    assert row.next_attempt_at is not None
    assert row.next_attempt_at > before


@override_app_settings("INBOX", RETRY_BASE_SECONDS=2.0, RETRY_MAX_SECONDS=60.0)
def test_backoff_is_exponential_with_jitter_and_capped():
    for attempts, full in ((1, 2.0), (2, 4.0), (3, 8.0), (10, 60.0)):
        delays = [retry_delay_seconds(attempts=attempts) for _ in range(50)]
        assert all(full / 2 <= d <= full for d in delays)
        assert len(set(delays)) > 1


def test_handlers_not_started_by_the_deadline_are_left_to_the_retry_task(applied):
    events = [Event(), Event()]
    result = record_batch(records(events), deadline=time.monotonic() - 1)
    assert (result.processed, result.deferred) == (0, 2)
    assert effect_counts(GROUP) == {}
    rows = InboxMessage.objects.all()
    assert {(r.status, r.attempts) for r in rows} == {("PENDING", 0)}
    assert all(r.next_attempt_at <= timezone.now() for r in rows)
    assert inbox_messages_retry_due(limit=10)["done"] == 2
    assert effect_counts(GROUP) == {e.event_id: 1 for e in events}


def test_without_deduplication_a_redelivery_runs_again(applied):
    event = Event()
    record_batch(records([event]), deduplicate=False)
    result = record_batch(records([event], start=1), deduplicate=False)
    assert (result.duplicates, result.processed) == (1, 1)
    assert effect_counts(GROUP) == {event.event_id: 2}


def test_exactly_once_skips_offsets_already_applied(applied):
    events = [Event() for _ in range(4)]
    result = record_batch(records(events[:2]), exactly_once=True, deduplicate=False)
    assert result.processed == 2
    assert ConsumerOffset.objects.get(consumer_group=GROUP).next_offset == 2
    # Offsets 0-1 again (a redelivery), then 2-3: only the new offsets run.
    result = record_batch(records(events), exactly_once=True, deduplicate=False)
    assert (result.skipped, result.processed) == (2, 2)
    assert effect_counts(GROUP) == {e.event_id: 1 for e in events}
    assert ConsumerOffset.objects.get(consumer_group=GROUP).next_offset == 4


def test_the_consumer_s_batches_store_their_next_offsets_in_every_mode(applied):
    events = [Event() for _ in range(5)]
    record_batch(records(events[:2]), track_positions=True)
    assert ConsumerOffset.objects.get(consumer_group=GROUP).next_offset == 2
    # A redelivery of offset 1 never moves it back.
    record_batch(records(events[1:2], start=1), track_positions=True)
    record_batch(records(events[2:], start=2), track_positions=True)
    assert ConsumerOffset.objects.get(consumer_group=GROUP).next_offset == 5


def test_a_batch_past_the_stored_offset_of_a_checked_partition_runs_nothing(applied):
    events = [Event() for _ in range(6)]
    record_batch(records(events[:2]), track_positions=True)
    # The consumer's next batch starts at 4: the database holds 2 as the next offset.
    with pytest.raises(PositionGap) as raised:
        record_batch(records(events[4:], start=4), check_positions={("t", 0): None})
    assert raised.value.stored == {("t", 0): 2}
    assert "t[0] at 4, stored 2" in str(raised.value)
    assert effect_counts(GROUP) == {e.event_id: 1 for e in events[:2]}
    assert InboxMessage.objects.count() == 2
    # Unchecked (the partition's position was checked earlier in the session), it records.
    result = record_batch(records(events[4:], start=4), check_positions={("t", 1): None})
    assert result.processed == 2


def test_a_partition_read_again_from_its_stored_offset_passes_its_check(applied):
    events = [Event() for _ in range(6)]
    record_batch(records(events[:2]), track_positions=True)
    # Read again from 2, the first record is at 3 (offset 2 holds no record: a transaction
    # marker, say): the check passes, and the stored offset moves on.
    result = record_batch(
        records(events[3:], start=3), track_positions=True, check_positions={("t", 0): 2}
    )
    assert result.processed == 3
    assert ConsumerOffset.objects.get(consumer_group=GROUP).next_offset == 6


def test_an_invalid_unknown_event_type_setting_is_refused(applied):
    with pytest.raises(ImproperlyConfiguredInbox):
        record_batch(records([Event()]), unknown_event_type="explode")


@pytest.mark.django_db(transaction=True)
def test_a_failed_handler_s_on_commit_callbacks_are_discarded(inbox_registry, effects):
    ran: list[str] = []

    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def apply(message):
        record_effect(group=GROUP, event_id=message.event_id)
        transaction.on_commit(lambda: ran.append(message.event_id))
        if message.payload.get("fail"):
            raise RuntimeError("no")

    ok, bad = Event(), Event(payload={"fail": True})
    record_batch(records([ok, bad]))
    assert ran == [ok.event_id]
    assert effect_counts(GROUP) == {ok.event_id: 1}


def test_handlers_may_use_atomic_blocks_of_their_own(inbox_registry, effects):
    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def apply(message):
        with transaction.atomic():
            record_effect(group=GROUP, event_id=message.event_id)
        try:
            with transaction.atomic():
                record_effect(group=GROUP, event_id="rolled back")
                raise ValueError("inner")
        except ValueError:
            pass

    event = Event()
    result = record_batch(records([event]))
    assert result.processed == 1
    assert effect_counts(GROUP) == {event.event_id: 1}


def test_a_handler_that_swallows_a_database_error_fails_cleanly(inbox_registry, effects):
    from django.db import DatabaseError, connection

    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def apply(message):
        record_effect(group=GROUP, event_id=message.event_id)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1/0")
        except DatabaseError:
            pass  # the transaction is aborted now; the inbox must not commit on top of it

    first, second = Event(), Event()
    result = record_batch(records([first, second]))
    assert result.failed == 2
    assert effect_counts(GROUP) == {}
    rows = InboxMessage.objects.all()
    assert {r.status for r in rows} == {"PENDING"}
    assert all("InFailedSqlTransaction" in r.last_error for r in rows)


def test_processed_at_is_when_each_handler_finished(inbox_registry):
    pause_seconds = 0.2
    finished: dict[str, dt.datetime] = {}

    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def slow(message):
        time.sleep(pause_seconds)
        finished[message.event_id] = timezone.now()

    events = [Event() for _ in range(3)]
    result = record_batch(records(events))

    rows = {r.event_id: r for r in InboxMessage.objects.all()}
    for event in events:
        row = rows[event.event_id]
        assert row.processed_at is not None
        assert row.received_at + dt.timedelta(seconds=pause_seconds) <= row.processed_at
        assert finished[event.event_id] <= row.processed_at <= timezone.now()
    # The consume lag read from the table is the one the metric observed.
    lags_from_rows = sorted(
        (rows[e.event_id].processed_at - rows[e.event_id].published_at).total_seconds()
        for e in events
    )
    assert lags_from_rows == pytest.approx(sorted(result.consume_lag_seconds), abs=0.001)


def _statements_of_a_batch(monkeypatch, size: int) -> int:
    import psycopg

    executed: list[str] = []
    real_execute = psycopg.Cursor.execute

    def execute(self, query, params=None, **kwargs):
        executed.append(str(query))
        return real_execute(self, query, params, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(psycopg.Cursor, "execute", execute)
        record_batch(records([Event() for _ in range(size)]))
    return len(executed)


@pytest.mark.parametrize(("ordering", "statements"), [("none", 5), ("key", 6)])
def test_a_batch_runs_the_same_few_statements_whatever_its_size(
    inbox_registry, monkeypatch, ordering, statements
):
    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def noop(message):
        pass

    # The lookup of existing rows, the INSERT and the INSERT of the handlers' attempts, in the
    # test's savepoint (and its release); with order per key, the look-up of the batch's held
    # keys too.
    with override_app_settings("INBOX", ORDERING=ordering):
        assert (
            _statements_of_a_batch(monkeypatch, 2)
            == _statements_of_a_batch(monkeypatch, 50)
            == statements
        )


def test_a_handler_s_message_carries_the_id_of_its_row(inbox_registry):
    ids: dict[str, int | None] = {}

    @handler(event_type="OrderPlaced", topic="t", group=GROUP)
    def remember(message):
        ids[message.event_id] = message.id

    events = [Event(), Event()]
    record_batch(records(events))
    assert ids == {e.event_id: InboxMessage.objects.get(event_id=e.event_id).id for e in events}


@pytest.mark.django_db(transaction=True)
def test_an_event_recorded_by_another_transaction_meanwhile_rolls_the_batch_back(
    inbox_registry, effects
):
    from django.db import connection

    from inbox.errors import ConcurrentDelivery

    group = f"svc-race-{uuid.uuid4().hex[:8]}"
    event, other = Event(), Event()
    database = connection.settings_dict

    @handler(event_type="OrderPlaced", topic="t", group=group)
    def apply(message):
        record_effect(group=group, event_id=message.event_id)

    @handler(event_type="Racy", topic="t", group=group)
    def record_elsewhere(message):
        # Another consumer of the same partition (its session expired but it went on)
        # records the event and commits while this transaction runs the handler.
        with connect_outside_django(database, autocommit=True) as elsewhere:
            # Were this transaction's row inserted already, the INSERT would wait for it.
            elsewhere.execute("SET lock_timeout = '5s'")
            elsewhere.execute(
                "INSERT INTO inbox_message (event_id, consumer_group, topic, partition, "
                '"offset", event_type, aggregate_type, aggregate_id, headers, raw_value, '
                "raw_value_encoding, status, attempts, last_error, received_at, "
                "duplicate_count) VALUES (%s, %s, 't', 0, 0, 'Racy', '', '', '{}', '', '', "
                "'DONE', 1, '', now(), 0)",
                [message.event_id, group],
            )

    racy = Event(event_type="Racy", event_id=event.event_id)
    with pytest.raises(ConcurrentDelivery, match=event.event_id), transaction.atomic():
        inbox_message_record_batch(group=group, records=records([other, racy]))
    # Nothing of the batch committed: not the other event's effect, nor its row.
    assert effect_counts(group) == {}
    rows = InboxMessage.objects.filter(consumer_group=group)
    assert list(rows.values_list("event_id", flat=True)) == [event.event_id]

    # Delivered again, the batch sees the row: a duplicate, and the rest is processed.
    with transaction.atomic():
        result = inbox_message_record_batch(group=group, records=records([other, racy]))
    assert (result.inserted, result.duplicates, result.processed) == (1, 1, 1)
    assert effect_counts(group) == {other.event_id: 1}
