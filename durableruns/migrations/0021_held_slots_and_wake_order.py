"""A cancelled run's slot is held until its worker lets go (issue 30), and the woken runs' order (issue 30).

- A limited run ended by someone else than its worker (a staff cancel, the cancel of its ancestor) while that
  worker may be inside a far call keeps the lease it had in run_state.lease_expires_at: until its worker, fenced
  out, lets go (store.runs.let_go sets it NULL) or that lease runs out, it still holds its slot of its
  (workflow, key). durableruns_admit counts those runs too; a run refused for such a slot is parked with a wake
  time, the held lease's end (durableruns_held_until), since nothing else happens when a lease runs out; a let-go
  lets the first parked run go (trigger run_state_slot_let_go), as a run leaving running does.
- run_state_limit_held_idx: the limited runs that are not running and still record a lease (few: the cancelled
  ones whose worker had not let go), which the admission counts per (workflow, key).
- run_state_wake_idx takes created_at after wake_at: runs woken at the same moment (tasks deferred to the same
  run_after) are claimed in the order they were recorded, on PostgreSQL as on SQLite (store.claims).
Both indexes are built CONCURRENTLY on PostgreSQL, so run_state keeps taking writes while they are built.
"""

from django.db import migrations, models
from django.db.models import Q

PARKED = "parked: its concurrency limit is reached"

LOCK = "pg_advisory_xact_lock(hashtext('durableruns.concurrency'), hashtext({workflow} || E'\\n' || {key}))"

# The key's slots held by runs that are not running: each still records the lease its worker had when someone
# else ended it, until that worker lets go; `p_run`, the run being admitted, is not counted (it takes over its own).
HELD = """FROM run_state
   WHERE status <> 'running' AND lease_expires_at IS NOT NULL AND concurrency_key IS NOT NULL
     AND workflow = p_workflow AND concurrency_key = p_key AND lease_expires_at > now() AND run_id <> p_run"""

FORWARD = f"""
CREATE OR REPLACE FUNCTION durableruns_unpark(p_workflow text, p_key text, p_except text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  UPDATE run_state SET status = 'pending', reason = '', wake_at = NULL, updated_at = now()
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
  -- key committed before (the calling claim's own snapshot is older). The running runs hold a slot each, and so
  -- does a run ended by someone else while its worker may still be inside a call (HELD).
  SELECT (SELECT count(*) FROM run_state
           WHERE status = 'running' AND concurrency_key IS NOT NULL AND workflow = p_workflow
             AND concurrency_key = p_key)
       + (SELECT count(*) {HELD}) INTO holding;
  IF holding >= p_limit THEN
    RETURN false;
  END IF;
  IF holding + 1 < p_limit THEN  -- room to spare after this one: let one parked run go too
    PERFORM durableruns_unpark(p_workflow, p_key, p_run);
  END IF;
  RETURN true;
END $$;

-- When the first slot of the key held by a run that is not running frees by itself (its lease runs out), NULL if
-- none is: a run refused a slot wakes then, as nothing else would let it go. Called under the key's lock, after
-- durableruns_admit refused, with a snapshot of its own as fresh as the admission's.
CREATE OR REPLACE FUNCTION durableruns_held_until(p_workflow text, p_key text, p_run text)
RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
  SELECT min(lease_expires_at) {HELD}
$$;

DROP TRIGGER IF EXISTS run_state_slot_let_go ON run_state;
CREATE TRIGGER run_state_slot_let_go AFTER UPDATE OF lease_expires_at ON run_state FOR EACH ROW
  WHEN (OLD.status <> 'running' AND NEW.status <> 'running' AND OLD.lease_expires_at IS NOT NULL
        AND NEW.lease_expires_at IS NULL AND NEW.concurrency_key IS NOT NULL)
  EXECUTE FUNCTION durableruns_slot_freed();
"""

BACKWARD = f"""
DROP TRIGGER IF EXISTS run_state_slot_let_go ON run_state;
DROP FUNCTION IF EXISTS durableruns_held_until(text, text, text);
CREATE OR REPLACE FUNCTION durableruns_admit(p_workflow text, p_key text, p_limit integer, p_run text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  holding integer;
BEGIN
  PERFORM {LOCK.format(workflow="p_workflow", key="p_key")};
  SELECT count(*) INTO holding FROM run_state
   WHERE status = 'running' AND concurrency_key IS NOT NULL AND workflow = p_workflow AND concurrency_key = p_key;
  IF holding >= p_limit THEN
    RETURN false;
  END IF;
  IF holding + 1 < p_limit THEN
    PERFORM durableruns_unpark(p_workflow, p_key, p_run);
  END IF;
  RETURN true;
END $$;
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


class RemoveIndexConcurrentlyOnPostgres(migrations.RemoveIndex):
    """RemoveIndex, dropped CONCURRENTLY on PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            schema_editor.remove_index(model, index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            schema_editor.add_index(model, index, concurrently=True)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY refuses to run in a transaction

    dependencies = [
        ("durableruns", "0020_run_state_parent"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="runstate",
            index=models.Index(fields=["workflow", "concurrency_key"], name="run_state_limit_held_idx",
                               condition=Q(concurrency_key__isnull=False, lease_expires_at__isnull=False)
                               & ~Q(status="running")),
        ),
        RemoveIndexConcurrentlyOnPostgres(model_name="runstate", name="run_state_wake_idx"),
        AddIndexConcurrentlyOnPostgres(
            model_name="runstate",
            index=models.Index(fields=["wake_at", "created_at"], name="run_state_wake_idx",
                               condition=Q(status="waiting")),
        ),
        migrations.RunPython(_on_postgres(FORWARD), _on_postgres(BACKWARD), elidable=False),
    ]
