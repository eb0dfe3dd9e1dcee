from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

import repos.services
from repos.migrating import rows_to_default


class Migration(migrations.Migration):
    dependencies = [
        ("autopilot", "0003_goal_repository"),
        ("repos", "0001_repositories"),
    ]

    operations = [
        migrations.AddField(
            model_name="basecheck",
            name="repository",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="base_checks",
                to="repos.repository",
            ),
        ),
        # Every existing check was of the default repository (ANNIHILATION_REPO).
        migrations.RunPython(rows_to_default("autopilot", "basecheck"), migrations.RunPython.noop),
        migrations.AlterField(
            model_name="basecheck",
            name="repository",
            field=models.ForeignKey(
                default=repos.services.default_repository_id,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="base_checks",
                to="repos.repository",
            ),
        ),
        migrations.RemoveIndex(model_name="basecheck", name="basecheck_time"),
        migrations.AddIndex(
            model_name="basecheck",
            index=models.Index(
                fields=["repository", "created_at"], name="basecheck_repository_time"
            ),
        ),
    ]
