from django.db import migrations


def load_default_roles(apps, schema_editor):
    from django.conf import settings

    from psychonauts.roles import role_parse

    Role = apps.get_model("psychonauts", "Role")
    for path in sorted(settings.PSYCHONAUTS_ROLE_DIR.glob("*.yaml")):
        fields = role_parse(path)
        name = fields.pop("name")
        Role.objects.get_or_create(name=name, defaults=fields)


class Migration(migrations.Migration):
    dependencies = [("psychonauts", "0001_runtime")]

    operations = [migrations.RunPython(load_default_roles, migrations.RunPython.noop)]
