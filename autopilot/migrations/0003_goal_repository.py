from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

import repos.services
from repos.migrating import rows_to_default


class Migration(migrations.Migration):
    dependencies = [
        ("autopilot", "0002_spend_goal_index_once"),
        ("repos", "0001_repositories"),
    ]

    operations = [
        migrations.AddField(
            model_name="goal",
            name="repository",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="goals",
                to="repos.repository",
            ),
        ),
        # Every existing row belongs to the default repository (ANNIHILATION_REPO).
        migrations.RunPython(rows_to_default("autopilot", "goal"), migrations.RunPython.noop),
        migrations.AlterField(
            model_name="goal",
            name="repository",
            field=models.ForeignKey(
                default=repos.services.default_repository_id,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="goals",
                to="repos.repository",
            ),
        ),
    ]
