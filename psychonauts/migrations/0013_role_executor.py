from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("psychonauts", "0009_trauma_scope")]

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
