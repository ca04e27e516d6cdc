"""Debounced starts, and the claim's admission on a moved clock (issue 35).

- run_state.debounce_key: the key of a run started with start(debounce=, key=) while it has not begun, unique per
  workflow among the runs not begun (run_state_debounce_key_uniq, partial: only pending or waiting runs with a
  key, so it costs every other run nothing). Built CONCURRENTLY on PostgreSQL, so run_state keeps taking writes.
- durableruns_admit and durableruns_held_until take the clock's shift (`p_shift`), as every other statement of
  the claim does, so a test clock (durableruns.testing.clock) that moves leases moves the slots a cancelled run
  still holds with them. The four- and three-argument versions stay, as the same functions with no shift, for
  workers of the previous deploy that still call them during a rolling deploy.
"""

from django.db import migrations, models
from django.db.models import Q

LOCK = "pg_advisory_xact_lock(hashtext('durableruns.concurrency'), hashtext({workflow} || E'\\n' || {key}))"

HELD = """FROM run_state
   WHERE status <> 'running' AND lease_expires_at IS NOT NULL AND concurrency_key IS NOT NULL
     AND workflow = p_workflow AND concurrency_key = p_key AND lease_expires_at > now() + p_shift
     AND run_id <> p_run"""

FORWARD = f"""
CREATE OR REPLACE FUNCTION durableruns_admit(p_workflow text, p_key text, p_limit integer, p_run text,
                                             p_shift interval)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  holding integer;
BEGIN
  PERFORM {LOCK.format(workflow="p_workflow", key="p_key")};
  -- As in migration 0021: a statement of its own after the lock, counting the running runs and those ended by
  -- someone else whose worker may still be inside a call (their lease not run out by the moved clock).
  SELECT (SELECT count(*) FROM run_state
           WHERE status = 'running' AND concurrency_key IS NOT NULL AND workflow = p_workflow
             AND concurrency_key = p_key)
       + (SELECT count(*) {HELD}) INTO holding;
  IF holding >= p_limit THEN
    RETURN false;
  END IF;
  IF holding + 1 < p_limit THEN
    PERFORM durableruns_unpark(p_workflow, p_key, p_run);
  END IF;
  RETURN true;
END $$;

CREATE OR REPLACE FUNCTION durableruns_held_until(p_workflow text, p_key text, p_run text, p_shift interval)
RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
  SELECT min(lease_expires_at) {HELD}
$$;

CREATE OR REPLACE FUNCTION durableruns_admit(p_workflow text, p_key text, p_limit integer, p_run text)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
  SELECT durableruns_admit(p_workflow, p_key, p_limit, p_run, interval '0')
$$;

CREATE OR REPLACE FUNCTION durableruns_held_until(p_workflow text, p_key text, p_run text)
RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
  SELECT durableruns_held_until(p_workflow, p_key, p_run, interval '0')
$$;
"""

BACKWARD = """
DROP FUNCTION IF EXISTS durableruns_admit(text, text, integer, text, interval);
DROP FUNCTION IF EXISTS durableruns_held_until(text, text, text, interval);
"""

INDEX = """CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS run_state_debounce_key_uniq ON run_state
  (workflow, debounce_key) WHERE debounce_key IS NOT NULL AND status IN ('pending', 'waiting')"""
NO_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS run_state_debounce_key_uniq"

CONSTRAINT = models.UniqueConstraint(fields=["workflow", "debounce_key"], name="run_state_debounce_key_uniq",
                                     condition=Q(debounce_key__isnull=False, status__in=["pending", "waiting"]))


def _on_postgres(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)
    return run


def _backwards(sql):
    """The backward functions of 0021 first: the four- and three-argument ones again, as 0021 made them."""
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            import importlib
            held = importlib.import_module("durableruns.migrations.0021_held_slots_and_wake_order")
            schema_editor.execute(sql)
            schema_editor.execute(held.FORWARD)
    return run


class AddDebounceConstraint(migrations.AddConstraint):
    """AddConstraint, its unique index built CONCURRENTLY on PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        schema_editor.execute(INDEX)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        schema_editor.execute(NO_INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY refuses to run in a transaction

    dependencies = [
        ("durableruns", "0022_rate_turn"),
    ]

    operations = [
        migrations.AddField(
            model_name="runstate",
            name="debounce_key",
            field=models.CharField(
                blank=True, max_length=200, null=True,
                help_text="The key of a debounced start (start(debounce=, key=)) while the run has not begun: a start "
                          "with the same key replaces its input and moves its start. Cleared by the claim that "
                          "begins it."),
        ),
        AddDebounceConstraint(model_name="runstate", constraint=CONSTRAINT),
        migrations.RunPython(_on_postgres(FORWARD), _backwards(BACKWARD), elidable=False),
    ]
