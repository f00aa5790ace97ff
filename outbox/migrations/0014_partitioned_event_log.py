from django.db import migrations, models

# The event and delivery tables become partitioned by day (UTC), so that retention drops a
# day's partition instead of deleting its rows one by one (outbox.services.partitions). The
# existing table is not copied: it becomes the partition of everything before tomorrow, and
# retention drops it like any other once its events are done. An empty one (a new database)
# is simply replaced. Tomorrow's partitions and the day after's are created here; beat's
# hourly maintenance keeps two days ahead from then on, and a DEFAULT partition takes any
# row no partition covers.
#
# PostgreSQL requires a unique index on a partitioned table to include the partition column,
# so `id` is no longer a primary key in the database (a plain index finds an event by id in
# each partition); a caller's own event ids are kept unique by outbox_event_given_id. The
# Django models keep `id` as their primary key: the ORM never relies on the constraint.

PARTITIONED = """
CREATE OR REPLACE FUNCTION pg_temp.outbox_partition_by_day(
    parent regclass, partition_column text, legacy text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    first_day timestamptz;
    day timestamptz;
    partition text;
    legacy_is_empty boolean;
BEGIN
    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %I)', legacy) INTO legacy_is_empty;
    IF legacy_is_empty THEN
        EXECUTE format('DROP TABLE %I', legacy);
        first_day := date_trunc('day', now(), 'UTC');
    ELSE
        EXECUTE format('SELECT date_trunc(''day'', greatest(now(), max(%I)), ''UTC'')'
                       ' + interval ''1 day'' FROM %I', partition_column, legacy)
            INTO first_day;
        EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                       parent, legacy, first_day);
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %s DEFAULT', parent::text || '_default', parent);
    FOR day IN SELECT generate_series(
        first_day, date_trunc('day', now(), 'UTC') + interval '2 days', interval '1 day'
    ) LOOP
        partition := parent::text || '_p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
        EXECUTE format('CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                       partition, parent, day, day + interval '1 day');
        -- As outbox.services.partitions does: the BRIN index of an empty table summarizes
        -- its first range, which would cost each insert there a WAL record.
        PERFORM brin_desummarize_range(index.indexrelid, 0)
        FROM pg_index AS index
        JOIN pg_class AS class ON class.oid = index.indexrelid
        JOIN pg_am AS method ON method.oid = class.relam
        WHERE index.indrelid = partition::regclass AND method.amname = 'brin';
    END LOOP;
END $$;

ALTER TABLE outbox_event RENAME TO outbox_event_before_partitioning;
ALTER TABLE outbox_event_before_partitioning RENAME CONSTRAINT outbox_event_pkey
    TO outbox_event_before_partitioning_pkey;
ALTER INDEX outbox_event_txid_idx RENAME TO outbox_event_before_partitioning_txid_idx;
ALTER INDEX outbox_event_key_idx RENAME TO outbox_event_before_partitioning_key_idx;
ALTER INDEX outbox_event_created_brin RENAME TO outbox_event_before_partitioning_created_brin;
DROP TRIGGER outbox_event_notify ON outbox_event_before_partitioning;
ALTER TABLE outbox_event_before_partitioning ALTER COLUMN position DROP DEFAULT;
CREATE TABLE outbox_event (
    id uuid NOT NULL,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb NOT NULL,
    headers jsonb NOT NULL,
    topic varchar(249) NOT NULL,
    key varchar(255) NOT NULL,
    created_at timestamptz NOT NULL,
    position bigint NOT NULL DEFAULT nextval('outbox_event_position_seq'),
    txid xid8 NOT NULL DEFAULT pg_current_xact_id()
) PARTITION BY RANGE (created_at);
-- Owned by the partitioned table: dropping the old partition must not drop the sequence.
ALTER SEQUENCE outbox_event_position_seq OWNED BY outbox_event.position;
CREATE INDEX outbox_event_id_idx ON outbox_event (id);
CREATE INDEX outbox_event_txid_idx ON outbox_event (txid, position);
CREATE INDEX outbox_event_key_idx ON outbox_event (key);
CREATE INDEX outbox_event_created_brin ON outbox_event USING brin (created_at)
    WITH (autosummarize = on);
CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
SELECT pg_temp.outbox_partition_by_day(
    'outbox_event', 'created_at', 'outbox_event_before_partitioning'
);
DO $$ BEGIN
    IF to_regclass('outbox_event_before_partitioning') IS NOT NULL THEN
        ALTER TABLE outbox_event_before_partitioning
            DROP CONSTRAINT outbox_event_before_partitioning_pkey;
    END IF;
END $$;

ALTER TABLE outbox_delivery RENAME TO outbox_delivery_before_partitioning;
ALTER INDEX outbox_delivery_event_idx RENAME TO outbox_delivery_before_partitioning_event_idx;
ALTER INDEX outbox_delivery_published_brin
    RENAME TO outbox_delivery_before_partitioning_published_brin;
-- Nothing looks a record up by id: the partitioned table has no index on it.
ALTER TABLE outbox_delivery_before_partitioning DROP CONSTRAINT outbox_delivery_pkey;
ALTER TABLE outbox_delivery_before_partitioning ALTER COLUMN id DROP IDENTITY;
CREATE SEQUENCE outbox_delivery_id_seq;
SELECT setval('outbox_delivery_id_seq', coalesce(max(id), 0) + 1, false)
FROM outbox_delivery_before_partitioning;
CREATE TABLE outbox_delivery (
    id bigint NOT NULL DEFAULT nextval('outbox_delivery_id_seq'),
    event_id uuid NOT NULL,
    outcome varchar(9) NOT NULL,
    published_at timestamptz NOT NULL,
    kafka_partition integer NULL,
    kafka_offset bigint NULL,
    error text NOT NULL,
    relay varchar(255) NOT NULL
) PARTITION BY RANGE (published_at);
ALTER SEQUENCE outbox_delivery_id_seq OWNED BY outbox_delivery.id;
CREATE INDEX outbox_delivery_event_idx ON outbox_delivery (event_id);
CREATE INDEX outbox_delivery_published_brin ON outbox_delivery USING brin (published_at)
    WITH (autosummarize = on);
SELECT pg_temp.outbox_partition_by_day(
    'outbox_delivery', 'published_at', 'outbox_delivery_before_partitioning'
);
DROP FUNCTION pg_temp.outbox_partition_by_day(regclass, text, text);
"""

# Back to one table each: the rows are copied (the partitions are dropped with their parent).
UNPARTITIONED = """
CREATE TABLE outbox_event_unpartitioned (LIKE outbox_event INCLUDING DEFAULTS);
INSERT INTO outbox_event_unpartitioned SELECT * FROM outbox_event;
ALTER SEQUENCE outbox_event_position_seq OWNED BY outbox_event_unpartitioned.position;
DROP TABLE outbox_event;
ALTER TABLE outbox_event_unpartitioned RENAME TO outbox_event;
ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_pkey PRIMARY KEY (id);
CREATE INDEX outbox_event_txid_idx ON outbox_event (txid, position);
CREATE INDEX outbox_event_key_idx ON outbox_event (key);
CREATE INDEX outbox_event_created_brin ON outbox_event USING brin (created_at)
    WITH (autosummarize = on);
CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();

CREATE TABLE outbox_delivery_unpartitioned (LIKE outbox_delivery);
INSERT INTO outbox_delivery_unpartitioned SELECT * FROM outbox_delivery;
DROP TABLE outbox_delivery;
ALTER TABLE outbox_delivery_unpartitioned RENAME TO outbox_delivery;
ALTER TABLE outbox_delivery ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY;
SELECT setval(pg_get_serial_sequence('outbox_delivery', 'id'), coalesce(max(id), 0) + 1, false)
FROM outbox_delivery;
ALTER TABLE outbox_delivery ADD CONSTRAINT outbox_delivery_pkey PRIMARY KEY (id);
CREATE INDEX outbox_delivery_event_idx ON outbox_delivery (event_id);
CREATE INDEX outbox_delivery_published_brin ON outbox_delivery USING brin (published_at)
    WITH (autosummarize = on);
"""


class Migration(migrations.Migration):
    dependencies = [("outbox", "0013_event_indexes_for_wal")]

    operations = [
        migrations.RunSQL(PARTITIONED, UNPARTITIONED),
        migrations.CreateModel(
            name="OutboxGivenEventId",
            fields=[
                ("id", models.UUIDField(primary_key=True, serialize=False)),
                ("created_at", models.DateTimeField()),
            ],
            options={"db_table": "outbox_event_given_id"},
        ),
    ]
