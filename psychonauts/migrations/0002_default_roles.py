from django.db import migrations


def load_default_roles(apps, schema_editor):
    from django.conf import settings

    from psychonauts.roles import role_parse

    Role = apps.get_model("psychonauts", "Role")
    for path in sorted(settings.PSYCHONAUTS_ROLE_DIR.glob("*.yaml")):
        fields = role_parse(path)
        name = fields.pop("name")
        # Fields a later migration adds are not on the model as it is here: their defaults hold.
        known = {f.name for f in Role._meta.get_fields()}
        fields = {k: v for k, v in fields.items() if k in known}
        Role.objects.get_or_create(name=name, defaults=fields)


class Migration(migrations.Migration):
    dependencies = [("psychonauts", "0001_runtime")]

    operations = [migrations.RunPython(load_default_roles, migrations.RunPython.noop)]
