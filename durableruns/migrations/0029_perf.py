"""Closer to the commit limit (issue 34): run_count's shards, 64 instead of 8; a run's end notifies only when
someone waits for it (run_waiter).

Each connection that finishes a run adds it to its own shard of run_count (durableruns_count_run, migration
run_count), a row it holds locked until its commit, WAL flush included. With pg_backend_pid() % 8, a pool of 16 or
32 connections (two or four `resume_runs --concurrency 8`) has two to four connections on every shard, and each
run's end waited on another's commit: bench.commit_limit saw 12% (2 workers) and 26% (4 workers) of the workers'
active backends waiting on a transaction's lock. With % 64 that many connections rarely share a shard. Readers sum
the shards whatever their number (durableruns.ops.metrics); the rows already counted stay where they are.
PostgreSQL only: SQLite's triggers keep no shards.

run_state_ended (migration 0019) notified durableruns_ended at every run's end. PostgreSQL serializes the commits
that notify: each takes one lock before it commits and holds it until its commit is flushed, so no two runs' ends
shared a WAL flush (the same benchmark saw 13% to 27% of the active backends waiting on that lock). durableruns.result()
now records itself in run_waiter (store.await_end) after its LISTEN and before its first read, and the function
notifies only for a run with a waiter. A caller of an older deploy, which records no waiter, is not notified: it
reads the record again every 5 s, as it does when its listening connection is lost.
"""

from django.db import migrations, models

FUNCTION = """
CREATE OR REPLACE FUNCTION durableruns_count_run() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    _shard smallint := pg_backend_pid() % {shards};
    _entered bigint := 0;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status IN ('completed', 'failed', 'cancelled') THEN
        INSERT INTO run_count AS c (workflow, status, shard, present, finished)
        VALUES (OLD.workflow, OLD.status, _shard, -1, 0)
        ON CONFLICT (workflow, status, shard) DO UPDATE SET present = c.present - 1;
    END IF;
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
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
END $$;
"""


NOTIFY_ENDED = {
    "waited": """
CREATE OR REPLACE FUNCTION durableruns_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM run_waiter WHERE run_id = NEW.run_id) THEN
    PERFORM pg_notify('durableruns_ended', NEW.run_id);
  END IF;
  RETURN NULL;
END $$;
""",
    "always": """
CREATE OR REPLACE FUNCTION durableruns_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('durableruns_ended', NEW.run_id);
  RETURN NULL;
END $$;
""",
}


def _notify(which):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(NOTIFY_ENDED[which], params=None)

    return run


def _shards(count):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(FUNCTION.format(shards=count), params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("durableruns", "0028_inbox"),
    ]

    operations = [
        migrations.RunPython(_shards(64), _shards(8)),
        migrations.CreateModel(
            name="RunWaiter",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("run_id", models.CharField(db_index=True, max_length=200)),
            ],
            options={"db_table": "run_waiter", "verbose_name": "run waiter"},
        ),
        migrations.RunPython(_notify("waited"), _notify("always")),
    ]
