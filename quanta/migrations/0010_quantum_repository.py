from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

import repos.services
from repos.migrating import rows_to_default


class Migration(migrations.Migration):
    dependencies = [
        ("quanta", "0009_import_key"),
        ("repos", "0001_repositories"),
    ]

    operations = [
        migrations.AddField(
            model_name="quantum",
            name="repository",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="quanta",
                to="repos.repository",
            ),
        ),
        # Every existing row belongs to the default repository (ANNIHILATION_REPO).
        migrations.RunPython(rows_to_default("quanta", "quantum"), migrations.RunPython.noop),
        migrations.AlterField(
            model_name="quantum",
            name="repository",
            field=models.ForeignKey(
                default=repos.services.default_repository_id,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="quanta",
                to="repos.repository",
            ),
        ),
        migrations.AddIndex(
            model_name="quantum",
            index=models.Index(
                condition=models.Q(("open_blockers", 0), ("status", "open")),
                fields=["repository", "priority", "created_at", "id"],
                name="quantum_ready_repository",
            ),
        ),
    ]
