from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("psychonauts", "0014_environment_build")]

    operations = [
        migrations.AddField(
            model_name="role",
            name="executor",
            field=models.CharField(
                choices=[("ours", "ours"), ("claude-code", "claude-code"), ("codex", "codex")],
                default="ours",
                max_length=20,
            ),
        ),
    ]
