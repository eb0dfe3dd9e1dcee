from django.db import migrations

# Events are an append-only log: the database itself refuses to rewrite one. (An adopted table
# has the trigger already; it is made again on the renamed function.)
SQL = """
CREATE OR REPLACE FUNCTION core_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only: UPDATE of event % refused', OLD.id;
END
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS event_append_only ON core_event;
CREATE TRIGGER event_append_only BEFORE UPDATE ON core_event
    FOR EACH ROW EXECUTE FUNCTION core_event_append_only();
"""
REVERSE = """
DROP TRIGGER IF EXISTS event_append_only ON core_event;
DROP FUNCTION IF EXISTS core_event_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("core", "0001_initial")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
