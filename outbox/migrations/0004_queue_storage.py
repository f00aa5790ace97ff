from django.db import migrations


class Migration(migrations.Migration):
    """Storage for a queue table: every event is updated twice (claimed, then marked).

    Free space on each page lets the claim's update stay on its page without touching the
    indexes (a HOT update), and frequent vacuuming keeps dead row versions from piling up
    in front of the relay's index scan.
    """

    dependencies = [("outbox", "0003_operator_action")]

    operations = [
        migrations.RunSQL(
            sql="""
            ALTER TABLE outbox_event SET (
                fillfactor = 70,
                autovacuum_vacuum_scale_factor = 0.02,
                autovacuum_vacuum_threshold = 1000,
                autovacuum_analyze_scale_factor = 0.02
            )
            """,
            reverse_sql="""
            ALTER TABLE outbox_event RESET (
                fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                autovacuum_analyze_scale_factor
            )
            """,
        ),
    ]
