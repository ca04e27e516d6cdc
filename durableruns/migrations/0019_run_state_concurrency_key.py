"""Concurrency limits per workflow and key (issue 23), and a notification when a run ends (durableruns.result).

- run_state.concurrency_key: nullable, no default, so PostgreSQL adds it without rewriting the table (a brief
  lock, no scan).
- Two partial indexes of limited runs only (the running ones a claim counts, the parked ones let go in order),
  built CONCURRENTLY on PostgreSQL: run_state keeps taking writes while they are built.
- On PostgreSQL, the functions and triggers the claim relies on (durableruns.store.claims, _CLAIMED_LIMITED):
  durableruns_admit(workflow, key, limit, run) admits a run under the (workflow, key) lock or refuses it;
  the trigger run_state_slot_freed lets the first parked run of a key go when a run of that key leaves running;
  the trigger run_state_ended notifies durableruns_ended with the run_id when a run ends (completed, failed,
  cancelled), on that commit: what durableruns.result() listens for.
The parked runs' reason is spelled here as durableruns.limits.PARKED spells it (a migration keeps its own copy).
"""

from django.db import migrations, models
from django.db.models import Q

PARKED = "parked: its concurrency limit is reached"

# One advisory lock per (workflow, key), in a lock space of durableruns' own (the two-key form's first key): held
# to the end of the transaction that takes it. A hash collision only makes two keys wait for each other.
LOCK = "pg_advisory_xact_lock(hashtext('durableruns.concurrency'), hashtext({workflow} || E'\\n' || {key}))"

FORWARD = f"""
CREATE OR REPLACE FUNCTION durableruns_unpark(p_workflow text, p_key text, p_except text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  -- the first parked run of the key (highest priority, then the oldest), skipping one a claim holds (that claim
  -- decides it under the key's lock); pending again, and idle workers woken on commit
  UPDATE run_state SET status = 'pending', reason = '', updated_at = now()
   WHERE run_id = (SELECT run_id FROM run_state
                    WHERE status = 'waiting' AND concurrency_key IS NOT NULL AND reason = '{PARKED}'
                      AND workflow = p_workflow AND concurrency_key = p_key AND run_id <> p_except
                    ORDER BY priority DESC, created_at LIMIT 1 FOR UPDATE SKIP LOCKED);
  IF FOUND THEN
    PERFORM pg_notify('durableruns_due', '');
  END IF;
END $$;

CREATE OR REPLACE FUNCTION durableruns_admit(p_workflow text, p_key text, p_limit integer, p_run text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  holding integer;
BEGIN
  PERFORM {LOCK.format(workflow="p_workflow", key="p_key")};
  -- A statement of this VOLATILE function: a snapshot taken now, after the lock, which sees every claim of the
  -- key committed before (the calling claim's own snapshot is older).
  SELECT count(*) INTO holding FROM run_state
   WHERE status = 'running' AND concurrency_key IS NOT NULL AND workflow = p_workflow AND concurrency_key = p_key;
  IF holding >= p_limit THEN
    RETURN false;
  END IF;
  IF holding + 1 < p_limit THEN  -- room to spare after this one: let one parked run go too
    PERFORM durableruns_unpark(p_workflow, p_key, p_run);
  END IF;
  RETURN true;
END $$;

CREATE OR REPLACE FUNCTION durableruns_slot_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM {LOCK.format(workflow="NEW.workflow", key="NEW.concurrency_key")};
  PERFORM durableruns_unpark(NEW.workflow, NEW.concurrency_key, NEW.run_id);
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS run_state_slot_freed ON run_state;
CREATE TRIGGER run_state_slot_freed AFTER UPDATE OF status ON run_state FOR EACH ROW
  WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND NEW.concurrency_key IS NOT NULL)
  EXECUTE FUNCTION durableruns_slot_freed();

CREATE OR REPLACE FUNCTION durableruns_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('durableruns_ended', NEW.run_id);
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS run_state_ended ON run_state;
CREATE TRIGGER run_state_ended AFTER UPDATE OF status ON run_state FOR EACH ROW
  WHEN (NEW.status IN ('completed', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION durableruns_run_ended();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS run_state_ended ON run_state;
DROP FUNCTION IF EXISTS durableruns_run_ended();
DROP TRIGGER IF EXISTS run_state_slot_freed ON run_state;
DROP FUNCTION IF EXISTS durableruns_slot_freed();
DROP FUNCTION IF EXISTS durableruns_admit(text, text, integer, text);
DROP FUNCTION IF EXISTS durableruns_unpark(text, text, text);
"""


def _on_postgres(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)
    return run


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on PostgreSQL (as in 0016)."""

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
        ("durableruns", "0018_run_count"),
    ]

    operations = [
        migrations.AddField(
            model_name="runstate",
            name="concurrency_key",
            field=models.CharField(
                blank=True, max_length=200, null=True,
                help_text="The key the run counts under for its workflow's concurrency limit, recorded at start: "
                          "empty for a limit on the whole workflow, NULL when its workflow had no limit then."),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="runstate",
            index=models.Index(fields=["workflow", "concurrency_key"], name="run_state_limit_running_idx",
                               condition=Q(status="running", concurrency_key__isnull=False)),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="runstate",
            index=models.Index(fields=["workflow", "concurrency_key", "-priority", "created_at"],
                               name="run_state_limit_parked_idx",
                               condition=Q(status="waiting", concurrency_key__isnull=False, reason=PARKED)),
        ),
        migrations.RunPython(_on_postgres(FORWARD), _on_postgres(BACKWARD), elidable=False),
    ]
