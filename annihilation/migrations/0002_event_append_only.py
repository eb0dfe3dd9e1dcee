from django.db import migrations

# Events are an append-only log: the database itself refuses to rewrite one.
SQL = """
CREATE FUNCTION annihilation_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only: UPDATE of event % refused', OLD.id;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER event_append_only BEFORE UPDATE ON annihilation_event
    FOR EACH ROW EXECUTE FUNCTION annihilation_event_append_only();
"""
REVERSE = """
DROP TRIGGER IF EXISTS event_append_only ON annihilation_event;
DROP FUNCTION IF EXISTS annihilation_event_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("annihilation", "0001_initial")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
