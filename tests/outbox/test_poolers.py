"""The outbox behind PgBouncer, which scripts/services.sh starts in both pool modes:
publishing works through either; the relay works through a session-mode pool and refuses a
transaction-mode one at start, naming what to set."""

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

import outbox
from outbox.log_relay import LogRelay
from outbox.models import OutboxDelivery
from outbox.services.event_log.shards import (
    SHARD_COUNT,
    SHARD_LOCK_CLASS,
    RelayNeedsItsSession,
    backend_pid,
)
from tests.conftest import (
    SESSION_POOL_PORT,
    TRANSACTION_POOL_PORT,
    connect_outside_django,
    connected_through,
)
from tests.outbox.conftest import assert_order_per_key, consume_all, headers_of, publish_events

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def server_sessions(port: int) -> tuple[int, int]:
    """The server process ids of this connection and of a second one, both through `port`."""
    with connected_through(port):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            first = cursor.fetchone()[0]
        probe = connection.get_new_connection(connection.get_connection_params())
        try:
            with probe.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                second = cursor.fetchone()[0]
        finally:
            probe.close()
    return first, second


def test_the_poolers_are_in_the_modes_the_tests_take_them_for():
    # In transaction mode the second connection gets the server session the first released;
    # in session mode it gets one of its own, as it does directly.
    first, second = server_sessions(TRANSACTION_POOL_PORT)
    assert first == second
    first, second = server_sessions(SESSION_POOL_PORT)
    assert first != second


def _advisory_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return int(cursor.fetchone()[0])


def test_the_relay_refuses_a_transaction_mode_pool_at_start_naming_what_to_set(kafka_topic):
    publish_events(kafka_topic(), 3)
    relay = LogRelay()
    with connected_through(TRANSACTION_POOL_PORT):
        with pytest.raises(RelayNeedsItsSession) as refused:
            relay.run(max_seconds=5)
        # It took no shard: no lock left on a server session that other clients get.
        assert _advisory_locks() == 0
    assert "transaction mode" in str(refused.value)
    assert "DATABASE_URL" in str(refused.value)
    assert relay.owned == ()
    # The long-running relay exits with that error rather than retry it as an outage.
    with (
        connected_through(TRANSACTION_POOL_PORT),
        pytest.raises(CommandError, match="DATABASE_URL"),
    ):
        call_command("outbox_relay", "--poll-seconds", "0.2")


def test_events_published_through_a_transaction_mode_pool_go_out_by_a_relay_in_a_session_one(
    kafka_topic, kafka_consumer_config, settings
):
    topic = kafka_topic(partitions=2)
    # Prepared statements do not survive a transaction-mode pool (PgBouncer before 1.21).
    settings.OUTBOX = {**settings.OUTBOX, "PUBLISH_PREPARED": False}
    with connected_through(TRANSACTION_POOL_PORT), transaction.atomic():
        published = [
            outbox.publish(
                aggregate_type="order",
                aggregate_id=f"order-{number % 4}",
                event_type="OrderPlaced",
                payload={"seq": number // 4},
                topic=topic,
            )
            for number in range(20)
        ]
    relay = LogRelay()
    with connected_through(SESSION_POOL_PORT):
        try:
            result = relay.run()
        finally:
            relay.close()

    assert result.published == 20
    messages = consume_all(kafka_consumer_config, topic, expected=20)
    assert sorted(headers_of(m)["event_id"] for m in messages) == sorted(
        str(event.id) for event in published
    )
    assert_order_per_key(messages)


def test_a_relay_back_on_its_reset_server_session_records_nothing_for_shards_it_lost(
    kafka_topic, kafka_consumer_config
):
    topic = kafka_topic()
    publish_events(topic, 10)
    relay = LogRelay()
    with connected_through(SESSION_POOL_PORT) as direct_port:
        try:
            assert relay.run().published == 10
            pid_before = backend_pid()
            # The relay's connection drops: the pooler resets its server session (DISCARD ALL
            # releases the shards' locks) and keeps it for the next client. Another relay
            # takes the shards meanwhile.
            connection.close()
            with connect_outside_django(
                {**connection.settings_dict, "PORT": direct_port}, autocommit=True
            ) as other:
                other.execute(
                    "SELECT pg_try_advisory_lock(%s, shard) FROM generate_series(0, %s) AS shard",
                    [SHARD_LOCK_CLASS, SHARD_COUNT - 1],
                )
                later = publish_events(topic, 5, start=10)
                # The relay's next connection gets the same server session back.
                assert backend_pid() == pid_before

                result = relay.run()

                assert result.published == 0
                assert relay.owned == ()
                assert not OutboxDelivery.objects.filter(
                    event_id__in=[event.id for event in later]
                ).exists()
            # The other relay gone, this one takes the shards again and sends what was left.
            assert relay.run().published == 5
        finally:
            relay.close()
    messages = consume_all(kafka_consumer_config, topic, expected=15)
    assert len({headers_of(m)["event_id"] for m in messages}) == 15
