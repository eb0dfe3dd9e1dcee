from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("psychonauts", "0010_sandbox_identity"),
    ]

    operations = [
        migrations.AddField(
            model_name="usage",
            name="cache_read_tokens",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="usage",
            name="cache_write_tokens",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="usage",
            name="cache_write_long_tokens",
            field=models.PositiveIntegerField(default=0),
        ),
    ]
