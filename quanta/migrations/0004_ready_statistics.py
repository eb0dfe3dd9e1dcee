from django.db import migrations

# The ready query filters on status = 'open' AND open_blockers = 0. The two columns are strongly
# correlated (closed quanta have no open blockers left to count, ...), and without extended
# statistics the planner multiplies their selectivities, overestimates the ready set by ~25x and
# picks a sequential scan over the partial index.


class Migration(migrations.Migration):
    dependencies = [("quanta", "0003_open_blockers")]
    operations = [
        migrations.RunSQL(
            "CREATE STATISTICS quantum_ready_stats (mcv, dependencies) ON status, open_blockers FROM quanta_quantum",
            "DROP STATISTICS IF EXISTS quantum_ready_stats",
        )
    ]
