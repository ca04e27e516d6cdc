"""run_count's shards: 64 instead of 8 (issue 34).

Each connection that finishes a run adds it to its own shard of run_count (durableruns_count_run, migration
run_count), a row it holds locked until its commit, WAL flush included. With pg_backend_pid() % 8, a pool of 16 or
32 connections (two or four `resume_runs --concurrency 8`) has two to four connections on every shard, and each
run's end waited on another's commit: bench.commit_limit saw 12% (2 workers) and 26% (4 workers) of the workers'
active backends waiting on a transaction's lock. With % 64 that many connections rarely share a shard. Readers sum
the shards whatever their number (durableruns.ops.metrics); the rows already counted stay where they are.
PostgreSQL only: SQLite's triggers keep no shards.
"""

from django.db import migrations

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


def _shards(count):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(FUNCTION.format(shards=count), params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("durableruns", "0027_attempt_error_detail"),
    ]

    operations = [
        migrations.RunPython(_shards(64), _shards(8)),
    ]
