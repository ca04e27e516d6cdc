"""A run's deadline (issue 32): run_state.deadline_at and on_deadline, recorded at start, and the wake-up.

- deadline_at: when the run must have ended, by the database's clock; on_deadline: what it then ends as (cancel
  or fail). Both nullable, added without rewriting run_state (and, on SQLite, without rebuilding it: a rebuild
  would drop the run_count triggers of 0018).
- run_state_deadline_idx: the unfinished runs with a deadline, in deadline order (the sweep of durableruns.
  deadlines); run_state_deadline_mail_idx: the runs a deadline ended that no alert has mailed about yet
  (ops.alerts). Both built CONCURRENTLY on PostgreSQL.
- run_state_wake_by_deadline: a run that begins waiting (a sleep, an event, an approval, a join, a backoff, a
  parked run) with a deadline still ahead wakes at the earlier of its wake time and its deadline, whichever
  statement wrote it: a wait for an event with no timeout (no wake time) wakes at the deadline. A run giving back
  what it holds (ending) is left as it is, and so is a wait begun after the deadline passed (the claim or the
  sweep ends that run; pulling its wake time to a past deadline would only make it due again and again).
"""

from django.db import migrations, models
from django.db.models import Q

POSTGRES_FORWARD = """
CREATE OR REPLACE FUNCTION durableruns_wake_by_deadline() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.deadline_at > now() AND (NEW.wake_at IS NULL OR NEW.wake_at > NEW.deadline_at) THEN
    NEW.wake_at := NEW.deadline_at;
  END IF;
  RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS run_state_wake_by_deadline ON run_state;
CREATE TRIGGER run_state_wake_by_deadline BEFORE INSERT OR UPDATE OF status, wake_at ON run_state FOR EACH ROW
  WHEN (NEW.status = 'waiting' AND NEW.deadline_at IS NOT NULL AND NEW.ending = '')
  EXECUTE FUNCTION durableruns_wake_by_deadline();
"""

POSTGRES_BACKWARD = """
DROP TRIGGER IF EXISTS run_state_wake_by_deadline ON run_state;
DROP FUNCTION IF EXISTS durableruns_wake_by_deadline();
"""

# SQLite's BEFORE triggers cannot set NEW: an AFTER trigger updates the row (recursive triggers are off, and the
# condition is false once it has run). Datetimes are stored as text in one format, which compares in time order.
_SQLITE_WAKE = """WHEN NEW.status = 'waiting' AND NEW.deadline_at IS NOT NULL AND NEW.ending = ''
  AND NEW.deadline_at > strftime('%Y-%m-%d %H:%M:%f', 'now')
  AND (NEW.wake_at IS NULL OR NEW.wake_at > NEW.deadline_at)
BEGIN
  UPDATE run_state SET wake_at = NEW.deadline_at WHERE run_id = NEW.run_id;
END"""

SQLITE_FORWARD = (
    "CREATE TRIGGER run_state_wake_by_deadline_insert AFTER INSERT ON run_state FOR EACH ROW " + _SQLITE_WAKE,
    "CREATE TRIGGER run_state_wake_by_deadline_update AFTER UPDATE OF status, wake_at ON run_state FOR EACH ROW "
    + _SQLITE_WAKE,
)
SQLITE_BACKWARD = (
    "DROP TRIGGER IF EXISTS run_state_wake_by_deadline_insert",
    "DROP TRIGGER IF EXISTS run_state_wake_by_deadline_update",
)


def install(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES_FORWARD)
    elif vendor == "sqlite":
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)


def uninstall(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES_BACKWARD)
    elif vendor == "sqlite":
        for statement in SQLITE_BACKWARD:
            schema_editor.execute(statement)


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on PostgreSQL (as in 0016 and 0021)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY refuses to run in a transaction

    dependencies = [
        ("durableruns", "0024_restart"),
    ]

    operations = [
        migrations.AddField(
            model_name="runstate",
            name="deadline_at",
            field=models.DateTimeField(
                blank=True, null=True,
                help_text="When the run must have ended, by the database's clock, counted from its start (Workflow("
                          "deadline=) or start(deadline=)); past it a worker ends the run (durableruns.deadlines). "
                          "NULL: none."),
        ),
        migrations.AddField(
            model_name="runstate",
            name="on_deadline",
            field=models.CharField(
                blank=True, max_length=10, null=True,
                help_text="What the run ends as once its deadline passes, recorded at start with it: cancel or fail."),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="runstate",
            index=models.Index(fields=["deadline_at"], name="run_state_deadline_idx",
                               condition=Q(deadline_at__isnull=False,
                                           status__in=["pending", "running", "waiting", "needs_decision"])),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="runstate",
            index=models.Index(fields=["deadline_at"], name="run_state_deadline_mail_idx",
                               condition=Q(status__in=["cancelled", "failed"], alerted_at__isnull=True,
                                           reason__startswith="deadline of ")),
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
