"""The consumer loop: poll a batch, record it in one database transaction, then commit offsets.

Order of a batch, and what a crash at each point leaves:
1. poll: a crash loses nothing (no offset was committed);
2. database transaction (inbox rows, handler effects, next offsets): a crash rolls it back,
   and the batch is redelivered and processed; a batch that starts past the next offset the
   database holds (checked once per partition and database session: a primary that failed
   over without its last commits) rolls back, and the partition is read again from there;
3. synchronous offset commit: a crash before it redelivers the batch, and the inbox rows
   make every message a counted duplicate (exactly-once mode: the consumer seeks past it).
"""

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from django.db import Error as DatabaseError
from django.db import close_old_connections, connection, transaction

from inbox.conf import inbox_settings
from inbox.config import inbox_consumer_config
from inbox.errors import NoHandlers, PositionGap
from inbox.faults import AFTER_DB_COMMIT, BEFORE_DB_COMMIT, fault_point
from inbox.metrics import BATCH_SECONDS
from inbox.records import parse_record
from inbox.registry import HandlerRegistry, get_registry
from inbox.selectors import consumer_offsets_for
from inbox.services.attempts import attempt_member
from inbox.services.recording import BatchResult, inbox_message_record_batch

logger = logging.getLogger(__name__)

# After a batch fails to record (database down, say), the consumer rewinds and waits this
# long before the next try, doubling up to the maximum.
ERROR_BACKOFF_SECONDS = 0.5
ERROR_BACKOFF_MAX_SECONDS = 30.0
STOP_CHECK_SECONDS = 0.5

PartitionKey = tuple[str, int]


class _AssignmentAbandoned(Exception):
    """The consumer was stopped while an assignment waited for the database."""


def _position(message: Message) -> tuple[PartitionKey, int]:
    return (message.topic() or "", message.partition() or 0), message.offset() or 0


class InboxConsumer:
    """One Kafka consumer for one inbox group. Not thread-safe; one per process or thread."""

    def __init__(
        self,
        *,
        group: str,
        topics: Sequence[str] | None = None,
        registry: HandlerRegistry | None = None,
        batch_size: int | None = None,
        poll_timeout: float | None = None,
        exactly_once: bool | None = None,
        config_overrides: dict[str, Any] | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
    ) -> None:
        self.group = group
        self.registry = registry if registry is not None else get_registry()
        self.topics = list(topics or self.registry.topics(group))
        if not self.topics:
            raise NoHandlers(
                f"Group {group!r} has no handlers and no --topic was given. Registered groups: "
                f"{', '.join(self.registry.groups()) or 'none'}."
            )
        self.batch_size = batch_size or inbox_settings.BATCH_SIZE
        self.poll_timeout = (
            inbox_settings.POLL_TIMEOUT_SECONDS if poll_timeout is None else poll_timeout
        )
        self.exactly_once = (
            group in inbox_settings.EXACTLY_ONCE_GROUPS if exactly_once is None else exactly_once
        )
        self.config = inbox_consumer_config(group=group, **(config_overrides or {}))
        self.on_batch = on_batch
        # Incremental assignment: the cooperative assignors of the classic protocol, and every
        # assignment of the consumer protocol (KIP-848), which librdkafka hands over in parts.
        self._cooperative = self.config.get("group.protocol") == "consumer" or "cooperative" in str(
            self.config.get("partition.assignment.strategy", "")
        )
        self.running = False
        self._consumer: Consumer | None = None
        self._assigned: set[PartitionKey] = set()
        # Messages polled but not yet recorded: on revoke they are finished and committed.
        self._in_flight: list[Message] = []
        self._error_backoff = ERROR_BACKOFF_SECONDS
        # The database session (psycopg connection) of the last batch, and the partitions
        # whose stored next offset a batch of that session checked: a new session (a start, a
        # reconnect, a failover among them) checks each partition's first batch again.
        self._session: object | None = None
        self._positions_checked: set[PartitionKey] = set()
        # Partitions read again from their stored next offset after a PositionGap.
        self._read_again_from: dict[PartitionKey, int] = {}

    # Lifecycle -------------------------------------------------------------------------

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("Call start() first.")
        return self._consumer

    def start(self) -> None:
        self._consumer = Consumer(self.config)
        self._consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self.running = True
        logger.info(
            "Inbox consumer for group %s on %s (exactly-once: %s)",
            self.group,
            ", ".join(self.topics),
            self.exactly_once,
        )

    def stop(self) -> None:
        """Asks the loop to stop after the batch in progress; safe from a signal handler."""
        self.running = False

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def run(self) -> None:
        self.start()
        try:
            while self.running:
                try:
                    self.poll_batch()
                except _AssignmentAbandoned:
                    logger.info("Group %s: stopped while waiting for the database", self.group)
                except KafkaException as error:
                    if not _is_fatal(error.args[0] if error.args else None):
                        raise
                    self._replace_after_fatal_error(error)
        finally:
            self.close()

    def _replace_after_fatal_error(self, error: KafkaException) -> None:
        # A fatal error (e.g. a static member fenced while the group coordinator moved)
        # leaves a consumer that never fetches again. Nothing of the batch in flight was
        # committed: a new consumer rejoins the group and resumes from the committed
        # offsets, and the inbox counts what comes again as duplicates.
        logger.error(
            "Group %s: fatal consumer error %s; rejoining with a new consumer in %.1fs",
            self.group,
            error,
            self._error_backoff,
        )
        self._in_flight = []
        self._assigned.clear()
        try:
            self.close()
        except KafkaException as close_error:
            logger.warning("Group %s: closing the failed consumer: %s", self.group, close_error)
            self._consumer = None
        time.sleep(self._error_backoff)
        self._error_backoff = min(self._error_backoff * 2, ERROR_BACKOFF_MAX_SECONDS)
        if self.running:
            self.start()

    # One batch -------------------------------------------------------------------------

    def poll_batch(self) -> BatchResult | None:
        first = self.consumer.poll(self.poll_timeout)
        if first is None:
            return None
        self._in_flight = [first]
        # Whatever is already fetched, without waiting: a lone event is not held back, and a
        # busy topic fills whole batches. A rebalance callback may run inside this call and
        # replace self._in_flight, so the call comes first and the list is looked up after.
        fetched = self.consumer.consume(self.batch_size - 1, timeout=0)
        self._in_flight.extend(fetched)
        batch, self._in_flight = self._in_flight, []
        return self._process(batch)

    def _process(self, messages: Sequence[Message]) -> BatchResult | None:
        usable = [m for m in messages if self._usable(m)]
        if not usable:
            return None
        close_old_connections()
        try:
            result = self._record_and_commit(usable)
        except PositionGap as gap:
            self._read_again(usable, gap)
            return None
        except Exception:
            logger.exception(
                "Group %s could not record a batch of %d; rewinding and retrying in %.1fs",
                self.group,
                len(usable),
                self._error_backoff,
            )
            self._rewind(usable)
            time.sleep(self._error_backoff)
            self._error_backoff = min(self._error_backoff * 2, ERROR_BACKOFF_MAX_SECONDS)
            return None
        self._error_backoff = ERROR_BACKOFF_SECONDS
        if self.on_batch is not None:
            self.on_batch(result)
        return result

    def _record_and_commit(self, messages: Sequence[Message]) -> BatchResult:
        started = time.monotonic()
        records = [parse_record(m) for m in messages]
        partitions = {(record.topic, record.partition) for record in records}
        with transaction.atomic():
            if connection.connection is not self._session:
                self._session, self._positions_checked = connection.connection, set()
            unchecked = {
                key: self._read_again_from.get(key) for key in partitions - self._positions_checked
            }
            result = inbox_message_record_batch(
                group=self.group,
                records=records,
                registry=self.registry,
                exactly_once=self.exactly_once,
                deadline=started + inbox_settings.BATCH_MAX_SECONDS,
                member=self._member(),
                track_positions=True,
                check_positions=unchecked or None,
            )
            fault_point(BEFORE_DB_COMMIT)
        fault_point(AFTER_DB_COMMIT)
        self._positions_checked |= partitions
        for key in partitions:
            self._read_again_from.pop(key, None)
        self._commit_offsets(messages)
        result.record_metrics(self.group)
        BATCH_SECONDS.labels(self.group).observe(time.monotonic() - started)
        return result

    def _member(self) -> str:
        """Who runs this batch's handlers, for their attempt rows: the group member id the
        coordinator gave this consumer (its client.id before it has one), at this process."""
        return attempt_member(self.consumer.memberid() or str(self.config.get("client.id", "")))

    def _usable(self, message: Message) -> bool:
        error = message.error()
        if error is not None:
            if _is_fatal(error):
                raise KafkaException(error)
            if error.code() != KafkaError._PARTITION_EOF:
                logger.warning("Group %s: consumer error %s", self.group, error)
            return False
        # A record fetched for a partition revoked meanwhile belongs to its new owner.
        return _position(message)[0] in self._assigned

    @staticmethod
    def _next_offsets(messages: Sequence[Message]) -> list[TopicPartition]:
        offsets: dict[PartitionKey, int] = {}
        for message in messages:
            key, offset = _position(message)
            offsets[key] = max(offsets.get(key, 0), offset + 1)
        return [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in offsets.items()
        ]

    def _commit_offsets(self, messages: Sequence[Message]) -> None:
        try:
            self.consumer.commit(offsets=self._next_offsets(messages), asynchronous=False)
        except KafkaException as error:
            # The group moved on (rebalance): the new owner gets these records again and the
            # inbox counts them as duplicates (exactly-once mode: it seeks past them).
            logger.warning("Group %s: offset commit failed: %s", self.group, error)

    def _rewind(self, messages: Sequence[Message]) -> None:
        first: dict[PartitionKey, int] = {}
        for message in messages:
            key, offset = _position(message)
            first[key] = min(first.get(key, offset), offset)
        for (topic, partition), offset in first.items():
            if (topic, partition) in self._assigned:
                try:
                    self.consumer.seek(TopicPartition(topic, partition, offset))
                except KafkaException as error:
                    logger.warning(
                        "Group %s: rewind of %s[%d] failed: %s", self.group, topic, partition, error
                    )

    def _read_again(self, messages: Sequence[Message], gap: PositionGap) -> None:
        """The database holds an earlier next offset than a batch's first record for some of
        its partitions: it lost the transactions of the records between (a primary that failed
        over without its last commits), or there is no record between. Those partitions are
        read again from the stored offset, the others from the batch's first records."""
        logger.warning(
            "Group %s: %s; reading those partitions again from the database's offsets",
            self.group,
            gap,
        )
        self._rewind(messages)
        for (topic, partition), offset in gap.stored.items():
            if (topic, partition) not in self._assigned:
                continue
            try:
                self.consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as error:
                logger.warning(
                    "Group %s: seek of %s[%d] to %d failed: %s",
                    self.group,
                    topic,
                    partition,
                    offset,
                    error,
                )
                continue
            self._read_again_from[(topic, partition)] = offset

    # Rebalance callbacks (run inside poll/consume) --------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.exactly_once:
            stored = self._stored_offsets(partitions)
            for partition in partitions:
                offset = stored.get((partition.topic, partition.partition))
                if offset is not None:
                    partition.offset = offset
            logger.info("Group %s: seeking to stored offsets %s", self.group, stored)
            if self._cooperative:
                consumer.incremental_assign(partitions)
            else:
                consumer.assign(partitions)
        assigned = {(p.topic, p.partition) for p in partitions}
        self._assigned |= assigned
        # Read from Kafka's committed offset, which may be past what the database holds.
        self._positions_checked -= assigned
        # A rebalance is what an operator looks for when a group slows down or stalls.
        logger.info(
            "Group %s: assigned %s",
            self.group,
            ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "no partition",
        )

    def _stored_offsets(self, partitions: list[TopicPartition]) -> dict[PartitionKey, int]:
        """The stored offsets of an exactly-once group, waiting for the database as long as
        it is down: no record of these partitions may be read before they are known (Kafka's
        committed offset can lag them, and auto.offset.reset=latest would skip records).
        Runs inside poll() or consume(); docs/inbox.md says what that means for the group."""
        backoff = ERROR_BACKOFF_SECONDS
        while True:
            close_old_connections()
            try:
                return consumer_offsets_for(
                    group=self.group, partitions=[(p.topic, p.partition) for p in partitions]
                )
            except DatabaseError as error:
                if not self.running:
                    # The client then assigns the partitions at the committed offsets, but
                    # poll() raises this, and run() closes the consumer before a record of
                    # theirs is processed.
                    raise _AssignmentAbandoned() from error
                logger.warning(
                    "Group %s: cannot read the stored offsets of %d partitions (%s); "
                    "retrying in %.1fs before reading them",
                    self.group,
                    len(partitions),
                    error,
                    backoff,
                )
            self._sleep_while_running(backoff)
            backoff = min(backoff * 2, ERROR_BACKOFF_MAX_SECONDS)

    def _sleep_while_running(self, seconds: float) -> None:
        # A stop (SIGTERM) during a long pause is honoured within STOP_CHECK_SECONDS.
        deadline = time.monotonic() + seconds
        while self.running and time.monotonic() < deadline:
            time.sleep(min(STOP_CHECK_SECONDS, max(0.0, deadline - time.monotonic())))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._in_flight:
            batch, self._in_flight = self._in_flight, []
            logger.info(
                "Group %s: finishing %d in-flight records before revoke", self.group, len(batch)
            )
            self._process(batch)
        revoked = {(p.topic, p.partition) for p in partitions}
        self._assigned -= revoked
        for key in revoked:
            self._read_again_from.pop(key, None)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {(p.topic, p.partition) for p in partitions}
        # Another member may own these already: committing would overwrite its progress.
        dropped = [m for m in self._in_flight if _position(m)[0] in lost]
        self._in_flight = [m for m in self._in_flight if _position(m)[0] not in lost]
        logger.warning(
            "Group %s: lost %s, dropped %d records", self.group, sorted(lost), len(dropped)
        )
        self._assigned -= lost
        for key in lost:
            self._read_again_from.pop(key, None)


def _is_fatal(error: object) -> bool:
    # librdkafka reports a fatal error as an event with code _FATAL, whose fatal() is False;
    # the underlying error (e.g. FENCED_INSTANCE_ID) carries the flag.
    return isinstance(error, KafkaError) and (error.fatal() or error.code() == KafkaError._FATAL)
