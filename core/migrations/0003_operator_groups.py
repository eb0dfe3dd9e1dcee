"""The two roles of the control room: `operators` (with core.operate) and `viewers`."""

from django.db import migrations


def create_groups(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    # The permission is normally created after migrate (post_migrate); the groups need it now.
    content_type, _ = ContentType.objects.get_or_create(app_label="core", model="access")
    operate, _ = Permission.objects.get_or_create(
        content_type=content_type,
        codename="operate",
        defaults={"name": "Can act in the control room (waves, answers, approvals)"},
    )
    operators, _ = Group.objects.get_or_create(name="operators")
    operators.permissions.add(operate)
    Group.objects.get_or_create(name="viewers")


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["operators", "viewers"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0002_event_append_only"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(create_groups, remove_groups)]
