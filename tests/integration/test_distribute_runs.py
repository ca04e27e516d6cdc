"""distribute_runs on a database that is not a Citus coordinator (single PostgreSQL, SQLite): refused with a clear
message and exit status 1, nothing changed. On a cluster: tests/citus/test_cluster.py (the Citus lane)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection

from tests.conftest import CITUS_LANE, ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(CITUS_LANE, reason="on the cluster distribute_runs lays the record out (tests/citus)")
def test_distribute_runs_refuses_a_database_without_citus_and_changes_nothing() -> None:
    def triggers() -> list[str]:
        if connection.vendor != "postgresql":
            return []
        with connection.cursor() as cursor:
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'run_state'::regclass ORDER BY tgname")
            return [name for (name,) in cursor.fetchall()]

    before = triggers()
    done = subprocess.run([sys.executable, "manage.py", "distribute_runs"], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, DATABASE_URL=database_url()), timeout=60)
    assert done.returncode == 1
    assert "is not a Citus coordinator (no citus extension): nothing changed" in done.stderr
    assert "Traceback" not in done.stderr
    assert triggers() == before
