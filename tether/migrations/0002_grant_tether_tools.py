"""Give the planner and the coder the tether's tools in databases seeded before this app had
them (roles are seeded once from YAML and never overwritten). Only adds missing names."""

from django.db import migrations

TOOLS = ["ask_tether", "propose_pipeline_change"]
ROLES = ["planner", "coder"]


def grant(apps, schema_editor):
    Role = apps.get_model("psychonauts", "Role")
    for role in Role.objects.filter(name__in=ROLES):
        allowed = list(role.allowed_tools)
        if allowed and any(t not in allowed for t in TOOLS):
            role.allowed_tools = allowed + [t for t in TOOLS if t not in allowed]
            role.save(update_fields=["allowed_tools"])


class Migration(migrations.Migration):
    dependencies = [("tether", "0001_ledger"), ("psychonauts", "0002_default_roles")]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
