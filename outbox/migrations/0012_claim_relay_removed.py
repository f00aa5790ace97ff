from django.db import migrations, models

# The relay name on the delivery records this migration writes for the claim relay's outcomes.
CLAIM_RELAY = "claim-relay"
# Migration 0009 and event_log_start_afresh write cursors under this name; any other name is
# a relay's (or a take-over's): the event-log relay has been sending.
MIGRATION_CURSOR = "migration"
SHARD_COUNT = 16


class ClaimRelayStillRunning(Exception):
    pass


def hand_over_from_the_claim_relay(apps, schema_editor):
    """Turns what the claim relay kept on the event rows into the event-log relay's records,
    before the columns go.

    With the table locked, no event commits meanwhile, so the tick taken here and the events
    handed over are seen at the same instant: each event visible at the tick is delivered,
    discarded or held here; each one committed later is read by the relay after the tick.
    - DONE events get a PUBLISHED delivery record (partition, offset and time as recorded),
      discarded ones a DISCARDED record: the console keeps showing them as before.
    - Every other event goes to the held set in its key's order (events written before
      migration 0009 carry no transaction id and come first), with its attempts and last
      error: a FAILED one waits for an operator, the others are due at once (or when their
      backoff ends). The relay sends each held event once, in order.
    The relay's cursors start at the tick: every event visible there is accounted for above.
    Nothing is held when the event-log relay has been sending already (a cursor of its own, or
    of a take-over: the claim relay never ran since) or the claim relay never sent."""
    db = schema_editor.connection.cursor()
    db.execute("LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE")
    db.execute(
        """
        SELECT max(locked_until) FROM outbox_event
        WHERE status = 'PENDING' AND locked_until > now()
        """
    )
    leased_until = db.fetchone()[0]
    if leased_until is not None:
        raise ClaimRelayStillRunning(
            "A claim relay holds events on lease until "
            f"{leased_until.isoformat()}: it may be sending them right now, and the event-log "
            "relay would send them again. Stop every claim relay (outbox_relay and beat's "
            "outbox.tasks.relay) and migrate once that time has passed."
        )
    db.execute(
        """
        INSERT INTO outbox_delivery (event_id, outcome, published_at, kafka_partition,
                                     kafka_offset, error, relay)
        SELECT event.id, 'PUBLISHED', event.published_at, event.kafka_partition,
               event.kafka_offset, '', %(relay)s
        FROM outbox_event AS event
        WHERE event.status = 'DONE' AND event.published_at IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM outbox_delivery AS delivery
                          WHERE delivery.event_id = event.id)
        """,
        {"relay": CLAIM_RELAY},
    )
    db.execute(
        """
        INSERT INTO outbox_delivery (event_id, outcome, published_at, error, relay)
        SELECT event.id, 'DISCARDED', event.discarded_at, event.last_error, %(relay)s
        FROM outbox_event AS event
        WHERE event.discarded_at IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM outbox_delivery AS delivery
                          WHERE delivery.event_id = event.id)
        """,
        {"relay": CLAIM_RELAY},
    )
    db.execute("SELECT relay FROM outbox_relay_cursor ORDER BY id DESC LIMIT 1")
    latest = db.fetchone()
    if latest is not None and latest[0] != MIGRATION_CURSOR:
        return
    db.execute(
        """
        SELECT EXISTS (
            SELECT 1 FROM outbox_event
            WHERE (txid IS NOT NULL
                   AND (status <> 'PENDING' OR attempts > 0 OR locked_until IS NOT NULL))
               OR (txid IS NULL AND status <> 'DONE' AND discarded_at IS NULL)
        )
        """
    )
    if not db.fetchone()[0]:
        # The claim relay never sent from this database since migration 0009: the event-log
        # relay's first cursor still covers every event.
        return
    # The last error of an event still undelivered, as its one FAILED record: the console
    # shows it in the event's timeline (earlier tries were not recorded one by one).
    db.execute(
        """
        INSERT INTO outbox_delivery (event_id, outcome, published_at, error, relay)
        SELECT event.id, 'FAILED', event.updated_at, event.last_error, %(relay)s
        FROM outbox_event AS event
        WHERE event.status <> 'DONE' AND event.discarded_at IS NULL AND event.attempts > 0
          AND NOT EXISTS (SELECT 1 FROM outbox_delivery AS delivery
                          WHERE delivery.event_id = event.id)
        """,
        {"relay": CLAIM_RELAY},
    )
    db.execute("INSERT INTO outbox_tick (snapshot) VALUES (pg_current_snapshot()) RETURNING id")
    tick_id = db.fetchone()[0]
    db.execute(
        """
        INSERT INTO outbox_relay_cursor (shards, tick_id, txid, position, relay)
        VALUES (ARRAY(SELECT generate_series(0, %(last)s))::smallint[], %(tick)s, '0'::xid8, 0,
                %(relay)s)
        """,
        {"last": SHARD_COUNT - 1, "tick": tick_id, "relay": CLAIM_RELAY},
    )
    db.execute(
        """
        INSERT INTO outbox_held_event (event_id, shard, topic, key, transaction_id, position,
                                       attempts, next_attempt_at, last_error, held_at)
        SELECT id, mod(hashtext(key) & 2147483647, %(shards)s), topic, key,
               coalesce(txid::text::bigint, 0), position, attempts,
               CASE WHEN status = 'FAILED' THEN NULL
                    ELSE greatest(next_attempt_at, now()) END,
               last_error, now()
        FROM outbox_event
        WHERE status <> 'DONE' AND discarded_at IS NULL
        ON CONFLICT (event_id) DO NOTHING
        """,
        {"shards": SHARD_COUNT},
    )


class Migration(migrations.Migration):
    """The claim relay is gone: its state on the event rows becomes delivery records and held
    events (hand_over_from_the_claim_relay), then its columns and indexes are dropped. An event
    row is written once and never changed again.

    Stop every claim relay before migrating: the migration refuses while one holds a lease."""

    dependencies = [("outbox", "0011_delivery_published_brin")]

    operations = [
        migrations.RunPython(hand_over_from_the_claim_relay, migrations.RunPython.noop),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_pending_idx"),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_undelivered_idx"),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_console_topic_idx"),
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_published_idx"),
        migrations.AddIndex(
            model_name="outboxevent",
            index=models.Index(fields=["topic", "created_at"], name="outbox_event_topic_idx"),
        ),
        migrations.RemoveField(model_name="outboxevent", name="status"),
        migrations.RemoveField(model_name="outboxevent", name="attempts"),
        migrations.RemoveField(model_name="outboxevent", name="next_attempt_at"),
        migrations.RemoveField(model_name="outboxevent", name="last_error"),
        migrations.RemoveField(model_name="outboxevent", name="published_at"),
        migrations.RemoveField(model_name="outboxevent", name="kafka_partition"),
        migrations.RemoveField(model_name="outboxevent", name="kafka_offset"),
        migrations.RemoveField(model_name="outboxevent", name="updated_at"),
        migrations.RemoveField(model_name="outboxevent", name="discarded_at"),
        migrations.RemoveField(model_name="outboxevent", name="locked_until"),
        migrations.RemoveField(model_name="outboxevent", name="locked_by"),
        # Pages full again: 0004 left room for the claim's updates, and there are none.
        # Existing pages fill up as new rows come; retention empties the old ones.
        migrations.RunSQL(
            "ALTER TABLE outbox_event RESET (fillfactor)",
            "ALTER TABLE outbox_event SET (fillfactor = 70)",
        ),
    ]
