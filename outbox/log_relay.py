"""The event-log relay: reads the events that became visible between two ticks (in the ticks'
order, and within them in position order: outbox.services.event_log.spans), sends them, and
records each outcome as an appended row. It never updates, locks or deletes an event row, so
neither a long-running transaction elsewhere in the database nor the number of keys changes its
pace.

A relay owns its share of the shards (by PostgreSQL advisory locks held by its database
session) and keeps one cursor per group of shards at the same place. For each group it reads
the next events up to the batch size, produces them all, waits for their delivery reports,
then writes in one transaction the delivery records and the cursor's new place. A crash
between the two sends the batch again (at least once; the inbox drops the copies); nothing is
skipped.

An event that fails holds its key: the events of that key behind it are recorded as held, not
sent, while the other keys go on. The held head is tried again with backoff and, once it goes,
the rest of its key follows in order."""

import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from confluent_kafka import KafkaException

from kafka_events.tracing import active_tracer
from outbox import metrics
from outbox.conf import outbox_settings
from outbox.models import OutboxDelivery, OutboxHeldEvent
from outbox.producer import discard_producer, get_producer
from outbox.relay import (
    DeliveryReports,
    default_relay_id,
    fault_point,
    publish_batch,
    publish_batch_in_transaction,
)
from outbox.services.event_log.batches import batch_record
from outbox.services.event_log.cursors import Cursor, cursors_grouped, cursors_read
from outbox.services.event_log.deliveries import DeliveryRecord, record_time
from outbox.services.event_log.held import (
    held_events_read,
    held_head_failed,
    held_heads_due,
    held_keys_among,
    held_keys_read,
    held_orphans_drop,
    held_release,
)
from outbox.services.event_log.shards import (
    ALL_SHARDS,
    SHARD_COUNT,
    ShardLost,
    backend_pid,
    relay_join,
    relay_leave,
    relays_running,
    session_kept_check,
    shards_lock,
    shards_unlock,
)
from outbox.services.event_log.spans import LogEvent, batch_prefetch, batch_read
from outbox.services.event_log.ticks import Tick, tick_latest_after, tick_read, tick_take
from outbox.tracing import Outcome as SendOutcome
from outbox.tracing import SendSpans, send_spans

logger = logging.getLogger(__name__)

Outcome = OutboxDelivery.Outcome
# Held keys whose head is retried per step.
HELD_KEYS_PER_STEP = 100
# A step reads the held keys of its shards once when there are at most this many; with more,
# each batch asks which of its own keys are held.
HELD_KEYS_READ_WHOLE = 1000
# A relay counts the relays running, to take or give back shards, at the start of each run()
# and at most this often while a run lasts: the count is a query on pg_locks.
SHARE_CHECK_SECONDS = 1.0
# After a batch of which nothing could be sent (the cluster unreachable), the relay waits
# this long before the same batch again, doubling up to OUTBOX["RETRY_MAX_SECONDS"].
OUTAGE_RETRY_SECONDS = 0.5
# A group of shards that finds only empty spans (its keys quiet while others' are not) records
# where it got once the tick it reached was taken this long after the one its recorded cursor
# names: otherwise a restart or the next Celery run would read again every span since, and
# retention and the console's counts would start from that old cursor.
QUIET_CURSOR_RECORD_SECONDS = 10.0


@dataclass
class LogRunResult:
    published: int = 0
    failed: int = 0
    # Events recorded as held behind a failed event of their key.
    held: int = 0
    # run() ended because nothing was left to send, not at its deadline.
    drained: bool = False

    def add(self, other: "LogRunResult") -> None:
        for counter in ("published", "failed", "held"):
            setattr(self, counter, getattr(self, counter) + getattr(other, counter))


@dataclass
class SentBatch:
    delivered: list[DeliveryRecord]
    failed: list[DeliveryRecord]
    fatal: bool
    # Failures for good: the producer's own refusals, and the cluster's answers that no retry
    # of the batch would change (outbox.relay.PERMANENT_RECORD_ERRORS).
    refused: set[uuid.UUID] = field(default_factory=set)
    # The send spans of the events produced, when tracing is on; ended by finish_spans().
    spans: SendSpans | None = None
    # Of the delivered: how many each topic got, and the publish lag of each, in seconds.
    published_per_topic: dict[str, int] = field(default_factory=dict)
    lag_seconds: list[float] = field(default_factory=list)

    def in_span(self, event_id: uuid.UUID) -> AbstractContextManager[None]:
        """The event's ended send span as the current context (for a log line about it),
        when tracing is on."""
        return nullcontext() if self.spans is None else self.spans.current(event_id)

    def finish_spans(self, failed_outcome: str) -> None:
        """Ends the send spans: the delivered as published, the failed with `failed_outcome`
        (those ended already are left as they are)."""
        if self.spans is None:
            return
        for record in self.delivered:
            self.spans.finish(record, SendOutcome.PUBLISHED)
        for record in self.failed:
            self.spans.finish(record, failed_outcome)
        self.spans.finish_unfinished("no outcome recorded")

    @property
    def nothing_reached_kafka(self) -> bool:
        """No record delivered, and at least one failed on the way to the broker: an
        outage, not a fault of the events."""
        return not self.delivered and (
            self.fatal or any(r.event_id not in self.refused for r in self.failed)
        )


class LogRelay:
    """Publishes the event log. Relays running side by side share the shards between them,
    and take over a dead relay's when its session ends."""

    def __init__(
        self,
        *,
        relay_id: str | None = None,
        transactional_id: str | None = None,
        batch_size: int | None = None,
        shards: Sequence[int] = ALL_SHARDS,
    ) -> None:
        self.transactional_id = transactional_id
        self.relay_id = relay_id or default_relay_id()
        self.batch_size = batch_size or outbox_settings.BATCH_SIZE
        self.wanted = tuple(sorted(shards))
        self.owned: tuple[int, ...] = ()
        self.owner_pid: int | None = None
        self.cursors: list[Cursor] = []
        self.ticks: dict[int, Tick] = {}
        # The tick of each owned shard's latest recorded cursor.
        self.recorded: dict[int, Tick] = {}
        self.outage_pause = OUTAGE_RETRY_SECONDS
        # Batches of each cursor (by its shards) sent in a row of which nothing reached
        # Kafka: the next try of that batch is this plus one (a send span's attempt).
        self.outage_tries: dict[tuple[int, ...], int] = {}
        # The try the next _send() makes of its events: a number for all, or one by event id
        # (held events); the attribute of their send spans when tracing is on.
        self.sending_attempt: int | Mapping[uuid.UUID, int] = 1
        # When _own_shards() last counted the relays running (time.monotonic()).
        self.share_checked_at = -math.inf
        # The thread that reads a backlog's next batch while the relay sends one, and what it
        # read: (the cursor read after, its batch_read()).
        self.reader: ThreadPoolExecutor | None = None
        self.read_ahead: tuple[Cursor, tuple[list[LogEvent], bool]] | None = None

    def run(self, *, max_seconds: float | None = None) -> LogRunResult:
        """Sends what the log holds for this relay's shards, for at most max_seconds."""
        deadline = time.monotonic() + (max_seconds or outbox_settings.RELAY_MAX_RUN_SECONDS)
        total = LogRunResult()
        self.share_checked_at = -math.inf
        while True:
            try:
                step, progressed = self._step()
            except ShardLost as lost:
                logger.warning("Outbox relay %s lost its shards: %s", self.relay_id, lost)
                self.owned, self.owner_pid = (), None
                return total
            total.add(step)
            if not progressed:
                total.drained = True
                return total
            if time.monotonic() >= deadline:
                return total

    def close(self) -> None:
        """Gives up the shards, for another relay to take at once."""
        if self.owner_pid is not None and self.owner_pid == backend_pid():
            shards_unlock(shards=self.owned)
            relay_leave(relay_id=self.relay_id)
        self.owned, self.owner_pid, self.cursors = (), None, []
        self.read_ahead = None
        if self.reader is not None:
            self.reader.shutdown()
            self.reader = None

    def _own_shards(self) -> None:
        """Owns this relay's share of the shards: all of them divided by the relays running,
        rounded up, counted at the start of each run and every SHARE_CHECK_SECONDS during one.
        A relay that owns more gives the rest back between two batches (its recorded cursors
        are where the next owner starts); one that owns less takes free ones."""
        pid = backend_pid()
        if pid != self.owner_pid:
            # A new database session: the locks of the old one went with it. So may the ticks
            # this relay knows (after a crash of PostgreSQL, a tick not yet on disk is gone and
            # its id may name another snapshot): they are read again.
            session_kept_check()
            self.owned, self.owner_pid, self.ticks = (), pid, {}
            relay_join(relay_id=self.relay_id)
        elif time.monotonic() < self.share_checked_at + SHARE_CHECK_SECONDS:
            return
        self.share_checked_at = time.monotonic()
        share = min(len(self.wanted), math.ceil(SHARD_COUNT / max(1, relays_running())))
        if len(self.owned) > share:
            given_back = self.owned[share:]
            shards_unlock(shards=given_back)
            self.owned = self.owned[:share]
        elif len(self.owned) < share:
            missing = [shard for shard in self.wanted if shard not in self.owned]
            taken = shards_lock(shards=missing, limit=share - len(self.owned))
            if not taken:
                return
            self.owned = tuple(sorted(self.owned + tuple(taken)))
        else:
            return
        logger.info("Outbox relay %s owns shards %s", self.relay_id, list(self.owned))
        self.cursors = cursors_read(shards=self.owned) if self.owned else []
        self.recorded = {}
        for cursor in self.cursors:
            self._note_recorded(cursor)

    def _step(self) -> tuple[LogRunResult, bool]:
        """One batch for each cursor, after the held keys that are due; returns what happened
        and whether anything moved."""
        self._own_shards()
        if not self.owned:
            return LogRunResult(), False
        result = LogRunResult()
        held_keys = held_keys_read(shards=self.owned, limit=HELD_KEYS_READ_WHOLE)
        # With no key held, no head can be due: one query fewer for most batches.
        progressed = held_keys != set() and self._retry_held(result)
        if progressed:
            held_keys = held_keys_read(shards=self.owned, limit=HELD_KEYS_READ_WHOLE)
        done_before = self._done_tick_id()
        cursors = []
        for cursor in self.cursors:
            moved, sent_any = self._advance(cursor, held_keys, result)
            progressed = progressed or sent_any
            cursors.append(moved)
        self.cursors = cursors_grouped(cursors)
        if held_keys != set() and self._done_tick_id() != done_before:
            # The cursors passed a tick a held head waited for (an operator's replay, for
            # which tick_take took one in a quiet database): it goes now, not at the next run.
            progressed = self._retry_held(result) or progressed
        return result, progressed

    def _done_tick_id(self) -> int | None:
        """The tick every event visible at which this relay's shards are done with."""
        return min((cursor.tick_id for cursor in self.cursors), default=None)

    def _tick(self, tick_id: int) -> Tick:
        tick = self.ticks.get(tick_id)
        if tick is None:
            tick = self.ticks[tick_id] = tick_read(tick_id=tick_id)
        return tick

    def _advance(
        self, cursor: Cursor, held_keys: set[tuple[str, str]] | None, result: LogRunResult
    ) -> tuple[Cursor, bool]:
        """Sends the next batch after `cursor`, but for the events of `held_keys` (None: too
        many to read, asked of the batch's keys); returns the cursor's new place and whether
        there were events."""
        # At most two spans: up to the latest tick, then up to a fresh one. Events of other
        # relays' shards make fresh ticks all the time; they must not keep this one here.
        for _ in range(2):
            since = self._tick(cursor.tick_id)
            if cursor.until_tick_id is not None:
                until: Tick | None = self._tick(cursor.until_tick_id)
            else:
                until = tick_latest_after(tick_id=cursor.tick_id) or tick_take(after=since)
                if until is None:
                    self._record_quiet_progress(cursor)
                    return cursor, False
                self.ticks = {since.id: since, until.id: until}
            assert until is not None
            events, span_done = self._read(cursor, since, until)
            if events:
                break
            # Kept in memory only: after a restart the relay reads the empty span again, at
            # the cost of one query.
            cursor = Cursor(shards=cursor.shards, tick_id=until.id)
        else:
            self._record_quiet_progress(cursor)
            return cursor, False
        if span_done:
            moved = Cursor(shards=cursor.shards, tick_id=until.id)
        else:
            moved = Cursor(
                shards=cursor.shards,
                tick_id=since.id,
                until_tick_id=until.id,
                position=events[-1].position,
            )
        if held_keys is None:
            held_keys = held_keys_among(events)
        to_send = (
            [event for event in events if (event.topic, event.key) not in held_keys]
            if held_keys
            else events
        )
        attempt = self.outage_tries.get(cursor.shards, 0) + 1
        self.sending_attempt = attempt
        sent = self._send_reading_ahead(to_send, moved, since, until)
        if to_send and sent.nothing_reached_kafka:
            sent.finish_spans(SendOutcome.RETRYING)
            self.outage_tries[cursor.shards] = attempt
            # Nothing went out: the cluster is unreachable or the producer broken. The tries
            # are recorded and the same batch is read again after a pause; an outage holds
            # no key.
            batch_record(
                relay_id=self.relay_id,
                owner_pid=self._owner_pid(),
                records=sent.failed,
                held=[],
                cursor=cursor,
                retry_seconds=outbox_settings.RETRY_BASE_SECONDS,
            )
            result.failed += len(sent.failed)
            self._pause_for_outage(sent)
            return cursor, False
        self.outage_pause = OUTAGE_RETRY_SECONDS
        self.outage_tries.pop(cursor.shards, None)
        # A failed event now holds its key, or waits behind the failed head of its key.
        sent.finish_spans(SendOutcome.HELD)
        held = self._held_in(events, sent, held_keys)
        fault_point("before-mark")
        batch_record(
            relay_id=self.relay_id,
            owner_pid=self._owner_pid(),
            records=sent.delivered + sent.failed,
            held=held,
            cursor=moved,
            retry_seconds=outbox_settings.RETRY_BASE_SECONDS,
        )
        self._note_recorded(moved)
        result.published += len(sent.delivered)
        result.failed += len(sent.failed)
        result.held += sum(1 for _, failure in held if failure is None)
        self._observe(events, sent)
        return moved, True

    def _read(self, cursor: Cursor, since: Tick, until: Tick) -> tuple[list[LogEvent], bool]:
        """batch_read(), or what was read ahead for this very cursor."""
        read_ahead, self.read_ahead = self.read_ahead, None
        if read_ahead is not None and read_ahead[0] == cursor:
            return read_ahead[1]
        return batch_read(
            cursor=cursor,
            since=since,
            until=until,
            limit=self.batch_size,
            max_bytes=outbox_settings.BATCH_MAX_BYTES,
        )

    def _send_reading_ahead(
        self, events: Sequence[LogEvent], moved: Cursor, since: Tick, until: Tick
    ) -> SentBatch:
        """_send(), while the database reads the batch after `moved`, when it comes from the
        span table (a span larger than a batch: a backlog): the relay's work on a batch and
        PostgreSQL's on the next overlap. The read is kept for _read() if it succeeded; one
        that failed is made again there."""
        if self.reader is None:
            self.reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-relay-read")
        ahead = batch_prefetch(
            cursor=moved,
            since=since,
            until=until,
            limit=self.batch_size,
            max_bytes=outbox_settings.BATCH_MAX_BYTES,
            executor=self.reader,
        )
        try:
            return self._send(events)
        finally:
            if ahead is not None:
                # The connection is the relay's again only once the read is done.
                wait([ahead])
                if ahead.exception() is None:
                    self.read_ahead = (moved, ahead.result())

    def _note_recorded(self, cursor: Cursor) -> None:
        tick = self._tick(cursor.tick_id)
        for shard in cursor.shards:
            self.recorded[shard] = tick

    def _record_quiet_progress(self, cursor: Cursor) -> None:
        """Records `cursor`, which passed only empty spans since its shards' recorded cursors,
        once the tick it reached was taken QUIET_CURSOR_RECORD_SECONDS after the oldest of
        theirs."""
        recorded = [self.recorded[shard] for shard in cursor.shards if shard in self.recorded]
        if not recorded or cursor.until_tick_id is not None:
            return
        oldest = min(recorded, key=lambda tick: tick.id)
        reached = self._tick(cursor.tick_id)
        if (reached.taken_at - oldest.taken_at).total_seconds() < QUIET_CURSOR_RECORD_SECONDS:
            return
        batch_record(
            relay_id=self.relay_id,
            owner_pid=self._owner_pid(),
            records=[],
            held=[],
            cursor=cursor,
            retry_seconds=outbox_settings.RETRY_BASE_SECONDS,
        )
        self._note_recorded(cursor)

    def _owner_pid(self) -> int:
        assert self.owner_pid is not None
        return self.owner_pid

    def _held_in(
        self, events: list[LogEvent], sent: SentBatch, held_keys: set[tuple[str, str]]
    ) -> list[tuple[LogEvent, DeliveryRecord | None]]:
        """The events of this batch to hold: each failed event of a key not held yet (a new
        head, with its failure), and every other event of a held key that did not go out."""
        if len(sent.delivered) == len(events):
            # All went out: none was held before (those are not sent), and none failed.
            return []
        failures = {record.event_id: record for record in sent.failed}
        delivered = {record.event_id for record in sent.delivered}
        held: list[tuple[LogEvent, DeliveryRecord | None]] = []
        for event in events:
            key = (event.topic, event.key)
            if event.id in delivered:
                if key in held_keys:
                    # The producer took it after refusing an earlier event of its key by a
                    # delivery report (a refusal at produce() stops the key at once).
                    with sent.in_span(event.id):
                        logger.error(
                            "Outbox relay: event %s of key %r went out after an earlier event "
                            "of its key failed in the same batch",
                            event.id,
                            event.key,
                        )
            elif event.id in failures and key not in held_keys:
                held.append((event, failures[event.id]))
                held_keys.add(key)
            else:
                held.append((event, None))
        return held

    def _send(self, events: Sequence[LogEvent]) -> SentBatch:
        """Sends the events, tried for the time self.sending_attempt says."""
        if not events:
            return SentBatch(delivered=[], failed=[], fatal=False)
        try:
            producer = get_producer(transactional_id=self.transactional_id)
        except KafkaException as error:
            logger.warning("Outbox relay cannot create its producer: %s", error)
            return SentBatch(delivered=[], failed=[], fatal=True)
        publish = publish_batch_in_transaction if self.transactional_id else publish_batch
        spans = send_spans(self.sending_attempt)
        try:
            # Past the producer's own delivery timeout, so that every record has its report.
            reports, fatal = publish(
                producer, events, timeout=producer.delivery_timeout_seconds + 5, spans=spans
            )
        except BaseException as error:
            if spans is not None:
                spans.finish_unfinished(f"{type(error).__name__}: {error}")
            raise
        sent = _sent_from(reports, events, fatal=fatal)
        sent.spans = spans
        if producer.fatal_error is not None:
            logger.error(
                "Outbox relay replaces its producer after a fatal error: %s", producer.fatal_error
            )
            discard_producer(producer)
        return sent

    def _pause_for_outage(self, sent: SentBatch) -> None:
        logger.warning(
            "Outbox relay sent none of a batch (%s); trying it again in %.1fs",
            sent.failed[0].error if sent.failed else "no producer",
            self.outage_pause,
        )
        time.sleep(self.outage_pause)
        self.outage_pause = min(self.outage_pause * 2, outbox_settings.RETRY_MAX_SECONDS)

    def _retry_held(self, result: LogRunResult) -> bool:
        """Tries the head of each held key that is due, all in one send; then, in one more,
        up to a batch of the events behind the heads that went, each key's in order until its
        next failure (the rest go at the next step, their key's new head due). A step waits
        for the heads' delivery reports once, however many keys are due: a head nothing
        answers (its partition without a leader) keeps the healthy heads waiting one delivery
        timeout, not one each. Returns whether anything was tried."""
        done_tick_id = self._done_tick_id()
        if done_tick_id is None:
            return False
        due = held_heads_due(shards=self.owned, done_tick_id=done_tick_id, limit=HELD_KEYS_PER_STEP)
        heads: list[LogEvent] = []
        for topic, key in due:
            first = held_events_read(topic=topic, key=key, limit=1)
            if first:
                heads.extend(first)
            else:
                # Its events were deleted (by hand, or with a test database): nothing to wait for.
                held_orphans_drop(topic=topic, key=key)
        # The heads alone first: were a head sent with the rest of its key, a refused head
        # could let its followers overtake it.
        gone = self._retry_in_order(heads, result)
        # Then the events behind the heads that went (no longer held), a batch in all.
        followers: list[LogEvent] = []
        for head in heads:
            room = self.batch_size - len(followers)
            if _key_of(head) in gone and room > 0:
                followers.extend(held_events_read(topic=head.topic, key=head.key, limit=room))
        self._retry_in_order(followers, result)
        return bool(due)

    def _retry_in_order(
        self, events: Sequence[LogEvent], result: LogRunResult
    ) -> set[tuple[str, str]]:
        """Sends held events, each key's in order; releases those delivered and counts a
        failed try on the first that did not go of each key, which stays held with those
        behind it. Returns the keys of which every event went."""
        if not events:
            return set()
        # The send spans' attempt numbers: read only when tracing is on.
        self.sending_attempt = _held_attempts(events) if active_tracer() is not None else 1
        sent = self._send(events)
        if sent.delivered:
            held_release(relay_id=self.relay_id, records=sent.delivered)
            result.published += len(sent.delivered)
            # The failures are counted below, by whether they spent the attempts.
            self._observe(events, replace(sent, failed=[]))
        delivered = {record.event_id for record in sent.delivered}
        failures = {record.event_id: record for record in sent.failed}
        stopped: set[tuple[str, str]] = set()
        for event in events:
            if event.id in delivered or _key_of(event) in stopped:
                continue
            stopped.add(_key_of(event))
            failure = failures.get(event.id) or DeliveryRecord(
                event_id=event.id,
                outcome=Outcome.FAILED,
                published_at=record_time(event, datetime.now(UTC)),
                error="the producer failed before a report",
            )
            spent = held_head_failed(
                relay_id=self.relay_id,
                record=failure,
                refused=event.id in sent.refused,
                max_attempts=outbox_settings.MAX_ATTEMPTS,
                base_seconds=outbox_settings.RETRY_BASE_SECONDS,
                max_seconds=outbox_settings.RETRY_MAX_SECONDS,
            )
            counter = metrics.FAILED if spent else metrics.RETRIED
            counter.labels(topic=event.topic).inc()
            result.failed += 1
            if sent.spans is not None:
                sent.spans.finish(failure, SendOutcome.FAILED if spent else SendOutcome.RETRYING)
        # The rest of each stopped key stays held behind its first failure.
        sent.finish_spans(SendOutcome.HELD)
        return {_key_of(event) for event in events} - stopped

    @staticmethod
    def _observe(events: Sequence[LogEvent], sent: SentBatch) -> None:
        """The batch's metrics, once for the batch."""
        for topic, count in sent.published_per_topic.items():
            metrics.PUBLISHED.labels(topic=topic).inc(count)
        metrics.PUBLISH_LAG.observe_many(sent.lag_seconds)
        if sent.failed:
            topic_of = {event.id: event.topic for event in events}
            for record in sent.failed:
                metrics.RETRIED.labels(topic=topic_of[record.event_id]).inc()


def _key_of(event: LogEvent) -> tuple[str, str]:
    return (event.topic, event.key)


def _held_attempts(events: Sequence[LogEvent]) -> dict[uuid.UUID, int]:
    """The number of the try about to be made of each held event: its failed tries so far
    (counted on a held head since its last retry by an operator), plus one."""
    held = OutboxHeldEvent.objects.filter(event_id__in=[event.id for event in events])
    return {
        event_id: attempts + 1 for event_id, attempts in held.values_list("event_id", "attempts")
    }


def _sent_from(reports: DeliveryReports, events: Sequence[LogEvent], *, fatal: bool) -> SentBatch:
    delivered = reports.delivered
    failed: list[DeliveryRecord] = []
    # Every event delivered or skipped (the common case) needs no look-up per event.
    if len(delivered) + len(reports.skipped) != len(events):
        now = datetime.now(UTC)
        delivered_ids = {record.event_id for record in delivered}
        failed = [
            DeliveryRecord(
                event_id=event.id,
                outcome=Outcome.FAILED,
                published_at=record_time(event, now),
                error=reports.failures.get(event.id, "no delivery report in time"),
                duration_ms=reports.failure_duration_ms(event),
            )
            for event in events
            if event.id not in delivered_ids and event.id not in reports.skipped
        ]
    return SentBatch(
        delivered=delivered,
        failed=failed,
        fatal=fatal,
        refused=reports.refused,
        published_per_topic=reports.published_per_topic,
        lag_seconds=reports.lag_seconds,
    )
