"""Migration 0016 adds its index to a populated run_state without a long lock: CREATE INDEX CONCURRENTLY outside a
transaction on PostgreSQL, a plain index elsewhere; and it goes back as cleanly."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from tests.conftest import CITUS_LANE

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        CITUS_LANE,
        reason="migrates the schema back and forth: a cluster is migrated, then distributed (docs/citus.md)",
    ),
]

BEFORE = [("durableruns", "0015_waits")]
INDEX = "run_state_unfinished_plan_idx"


def indexes() -> set[str]:
    with connection.cursor() as cursor:
        return {name for name, info in connection.introspection.get_constraints(cursor, "run_state").items()
                if info["index"]}


def test_0016_builds_the_unfinished_by_plan_index_on_a_populated_table_without_a_transaction():
    sql = StringIO()
    call_command("sqlmigrate", "durableruns", "0016", stdout=sql)
    if connection.vendor == "postgresql":
        assert "CREATE INDEX CONCURRENTLY" in sql.getvalue() and "BEGIN" not in sql.getvalue(), sql.getvalue()
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        assert INDEX not in indexes()
        old = executor.loader.project_state(BEFORE).apps.get_model("durableruns", "RunState")
        now = timezone.now()
        old.objects.bulk_create([old(run_id=f"run-{n}", workflow="scripted", plan_fingerprint="f" * 16,
                                     status="completed" if n % 2 else "waiting", input={}, created_at=now,
                                     updated_at=now) for n in range(200)])
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("durableruns"))
    assert INDEX in indexes()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT i.indisvalid, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i "
                           "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s", [INDEX])
            valid, predicate = cursor.fetchone()
        assert valid and "needs_decision" in predicate and "completed" not in predicate
