"""Labels join the full-text vector (weight A, beside the title): every vector is recomputed."""

from django.conf import settings
from django.db import migrations


def recompute(apps, schema_editor):  # type: ignore[no-untyped-def]
    Quantum = apps.get_model("quanta", "Quantum")
    Comment = apps.get_model("quanta", "Comment")
    schema_editor.execute(
        f"""
        UPDATE {Quantum._meta.db_table} q SET search_vector =
            setweight(to_tsvector(%(cfg)s::regconfig, q.title), 'A')
            || setweight(to_tsvector(%(cfg)s::regconfig, array_to_string(q.labels, ' ')), 'A')
            || setweight(to_tsvector(%(cfg)s::regconfig, q.body), 'B')
            || setweight(to_tsvector(%(cfg)s::regconfig, coalesce(
                (SELECT string_agg(c.body, ' ') FROM {Comment._meta.db_table} c
                  WHERE c.quantum_id = q.id), '')), 'C')
        """,
        {"cfg": settings.SEARCH_CONFIG},
    )


class Migration(migrations.Migration):
    dependencies = [("quanta", "0007_quantum_list_order")]

    operations = [migrations.RunPython(recompute, migrations.RunPython.noop)]
