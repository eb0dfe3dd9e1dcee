from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

import repos.services
from repos.migrating import rows_to_default


class Migration(migrations.Migration):
    dependencies = [
        ("bursts", "0004_fewer_indexes"),
        ("repos", "0001_repositories"),
    ]

    operations = [
        migrations.AddField(
            model_name="wave",
            name="repository",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="waves",
                to="repos.repository",
            ),
        ),
        # Every existing row belongs to the default repository (ANNIHILATION_REPO).
        migrations.RunPython(rows_to_default("bursts", "wave"), migrations.RunPython.noop),
        migrations.AlterField(
            model_name="wave",
            name="repository",
            field=models.ForeignKey(
                default=repos.services.default_repository_id,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="waves",
                to="repos.repository",
            ),
        ),
    ]
