from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("psychonauts", "0011_usage_cache_tokens"),
    ]

    operations = [
        migrations.AddField(
            model_name="usage",
            name="priced",
            field=models.BooleanField(default=True),
        ),
    ]
