"""Finished runs counted as they finish (run_count), so the metrics view reads a few rows, not every run kept.

run_count holds, per workflow, finished status (completed, failed, cancelled) and shard, the runs present in
run_state (`present`, a gauge: a prune or a retry takes runs away) and the times runs entered that status
(`finished`, a counter: it only grows). The database keeps it, in the commit that changes the run:

- PostgreSQL: row triggers on INSERT and on UPDATE OF status, workflow, each with a WHEN clause, so the many
  writes that do not finish or reopen a run (a claim, a step's result, a lease renewal) never call the function;
  a statement trigger on DELETE that reads the deleted rows as a transition table, so a prune's batch costs one
  upsert per (workflow, status), not one per run; and TRUNCATE sets `present` to zero. Each connection writes its
  own shard (pg_backend_pid() % 8), so two workers finishing runs of one workflow rarely wait on one row.
- SQLite: row triggers on INSERT and UPDATE OF status keep `finished` only. The gauge counts run_state itself
  there (SQLite sites are small, one host), so nothing a DELETE does needs counting: a flush or a prune cannot
  leave the counts wrong.

Seeding without a long lock (PostgreSQL): the triggers are created first, in a short transaction of their own
(CREATE TRIGGER waits for the writes in flight, then blocks writes only until it commits). From then on every
change is counted by a trigger. Then one statement, in one snapshot, counts the finished runs present (A) and
subtracts what the triggers have already counted (V) for each (workflow, status): A - V is what was present when
the triggers came, whatever committed in between; it is added to shard 0. That count reads run_state without
blocking its writers. Hence atomic = False.
"""

from django.db import migrations, models, transaction

FINISHED = "('completed', 'failed', 'cancelled')"

POSTGRES_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION durableruns_count_run() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    _shard smallint := pg_backend_pid() % 8;
    _entered bigint := 0;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status IN {FINISHED} THEN
        INSERT INTO run_count AS c (workflow, status, shard, present, finished)
        VALUES (OLD.workflow, OLD.status, _shard, -1, 0)
        ON CONFLICT (workflow, status, shard) DO UPDATE SET present = c.present - 1;
    END IF;
    IF NEW.status IN {FINISHED} THEN
        IF TG_OP = 'INSERT' THEN
            _entered := 1;
        ELSIF OLD.status IS DISTINCT FROM NEW.status THEN
            _entered := 1;
        END IF;
        INSERT INTO run_count AS c (workflow, status, shard, present, finished)
        VALUES (NEW.workflow, NEW.status, _shard, 1, _entered)
        ON CONFLICT (workflow, status, shard) DO UPDATE
            SET present = c.present + 1, finished = c.finished + EXCLUDED.finished;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION durableruns_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- One upsert per (workflow, status) of the statement's deleted rows, in key order (two statements that
    -- touch the same keys take their row locks in the same order).
    INSERT INTO run_count AS c (workflow, status, shard, present, finished)
    SELECT workflow, status, pg_backend_pid() % 8, -count(*), 0 FROM durableruns_gone
    WHERE status IN {FINISHED}
    GROUP BY workflow, status ORDER BY workflow, status
    ON CONFLICT (workflow, status, shard) DO UPDATE SET present = c.present + EXCLUDED.present;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION durableruns_count_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE run_count SET present = 0 WHERE present <> 0;
    RETURN NULL;
END
$$;
"""

POSTGRES_TRIGGERS = f"""
DROP TRIGGER IF EXISTS run_state_count_insert ON run_state;
DROP TRIGGER IF EXISTS run_state_count_update ON run_state;
DROP TRIGGER IF EXISTS run_state_count_delete ON run_state;
DROP TRIGGER IF EXISTS run_state_count_truncate ON run_state;
CREATE TRIGGER run_state_count_insert AFTER INSERT ON run_state FOR EACH ROW
    WHEN (NEW.status IN {FINISHED}) EXECUTE FUNCTION durableruns_count_run();
CREATE TRIGGER run_state_count_update AFTER UPDATE OF status, workflow ON run_state FOR EACH ROW
    WHEN ((OLD.status, OLD.workflow) IS DISTINCT FROM (NEW.status, NEW.workflow)
          AND (OLD.status IN {FINISHED} OR NEW.status IN {FINISHED}))
    EXECUTE FUNCTION durableruns_count_run();
CREATE TRIGGER run_state_count_delete AFTER DELETE ON run_state REFERENCING OLD TABLE AS durableruns_gone
    FOR EACH STATEMENT EXECUTE FUNCTION durableruns_count_deleted();
CREATE TRIGGER run_state_count_truncate AFTER TRUNCATE ON run_state
    FOR EACH STATEMENT EXECUTE FUNCTION durableruns_count_truncated();
"""

# One statement, so one snapshot: present now minus what the triggers counted = present when they came.
POSTGRES_SEED = f"""
INSERT INTO run_count AS c (workflow, status, shard, present, finished)
SELECT workflow, status, 0, n, n FROM (
    SELECT workflow, status, COALESCE(now_present.n, 0) - COALESCE(counted.n, 0) AS n
    FROM (SELECT workflow, status, count(*) AS n FROM run_state WHERE status IN {FINISHED}
          GROUP BY workflow, status) AS now_present
    FULL JOIN (SELECT workflow, status, sum(present) AS n FROM run_count GROUP BY workflow, status) AS counted
        USING (workflow, status)
) AS before_triggers
WHERE n <> 0
ORDER BY workflow, status
ON CONFLICT (workflow, status, shard) DO UPDATE
    SET present = c.present + EXCLUDED.present, finished = c.finished + EXCLUDED.finished
"""

POSTGRES_DROP = """
DROP TRIGGER IF EXISTS run_state_count_insert ON run_state;
DROP TRIGGER IF EXISTS run_state_count_update ON run_state;
DROP TRIGGER IF EXISTS run_state_count_delete ON run_state;
DROP TRIGGER IF EXISTS run_state_count_truncate ON run_state;
DROP FUNCTION IF EXISTS durableruns_count_run();
DROP FUNCTION IF EXISTS durableruns_count_deleted();
DROP FUNCTION IF EXISTS durableruns_count_truncated();
"""

_SQLITE_COUNT = f"""
BEGIN
    INSERT INTO run_count (workflow, status, shard, present, finished) VALUES (NEW.workflow, NEW.status, 0, 0, 1)
    ON CONFLICT (workflow, status, shard) DO UPDATE SET finished = finished + 1;
END"""

SQLITE_TRIGGERS = (
    f"CREATE TRIGGER run_state_count_insert AFTER INSERT ON run_state FOR EACH ROW "
    f"WHEN NEW.status IN {FINISHED} {_SQLITE_COUNT}",
    f"CREATE TRIGGER run_state_count_update AFTER UPDATE OF status ON run_state FOR EACH ROW "
    f"WHEN NEW.status IN {FINISHED} AND OLD.status IS NOT NEW.status {_SQLITE_COUNT}",
)

SQLITE_SEED = f"""
INSERT INTO run_count (workflow, status, shard, present, finished)
SELECT workflow, status, 0, 0, count(*) FROM run_state WHERE status IN {FINISHED} GROUP BY workflow, status
"""

SQLITE_DROP = ("DROP TRIGGER IF EXISTS run_state_count_insert", "DROP TRIGGER IF EXISTS run_state_count_update")


def install(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(POSTGRES_FUNCTIONS)
            cursor.execute(POSTGRES_TRIGGERS)
        with connection.cursor() as cursor:  # autocommit: a transaction of its own, after the triggers'
            cursor.execute(POSTGRES_SEED)
    elif connection.vendor == "sqlite":
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            for statement in SQLITE_TRIGGERS:
                cursor.execute(statement)
            cursor.execute(SQLITE_SEED)


def uninstall(apps, schema_editor):
    connection = schema_editor.connection
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(POSTGRES_DROP)
        elif connection.vendor == "sqlite":
            for statement in SQLITE_DROP:
                cursor.execute(statement)


class Migration(migrations.Migration):
    atomic = False  # the triggers commit before the seed counts the runs (see above)

    dependencies = [
        ("durableruns", "0017_intervention_user_no_constraint"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunCount",
            fields=[
                ("pk", models.CompositePrimaryKey("workflow", "status", "shard", blank=True, editable=False,
                                                  primary_key=True, serialize=False)),
                ("workflow", models.CharField(max_length=200)),
                ("status", models.CharField(choices=[("pending", "pending"), ("running", "running"),
                                                     ("waiting", "waiting"), ("needs_decision", "needs decision"),
                                                     ("completed", "completed"), ("failed", "failed"),
                                                     ("cancelled", "cancelled")], max_length=20)),
                ("shard", models.SmallIntegerField()),
                ("present", models.BigIntegerField(default=0, help_text='Runs of this workflow in this status in run_state now, in this shard (PostgreSQL; 0 on SQLite, whose gauge counts run_state itself). Goes down when a run is pruned, deleted or retried.')),
                ("finished", models.BigIntegerField(default=0, help_text='Times a run of this workflow entered this status, in this shard, since the migration that made this table (which counted the runs then present). Never goes down: a prune removes rows, not what happened.')),
            ],
            options={"verbose_name": "run count", "db_table": "run_count"},
        ),
        migrations.RunPython(install, uninstall),
    ]
