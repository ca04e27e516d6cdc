"""bench.check_cost runs end to end at a tiny size: the step's statement measured on the migrated record and on a
copy without its CHECK constraints, the copy differing by those alone; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.check_cost import checks_of
from bench.pg import conninfo, recreate_database
from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

DB = "dr_bench_smoke_checks"


def columns_and_indexes(dbname: str) -> list[tuple[str, ...]]:
    import psycopg

    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        return conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name IN ('run_state', 'run_step') UNION ALL "
            "SELECT tablename, indexname, indexdef, '' FROM pg_indexes WHERE tablename IN ('run_state', 'run_step') "
            "ORDER BY 1, 2").fetchall()


def test_the_check_cost_bench_compares_the_record_with_a_copy_that_lacks_only_its_checks(tmp_path):
    recreate_database(DB)
    command = [sys.executable, "-m", "bench.check_cost", "--rounds", "1", "--seconds", "1", "--db", DB,
               "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    figures = json.loads((tmp_path / "check_cost.json").read_text())["figures"]
    assert figures["checked"]["tps"]["median"] > 0 and figures["unchecked"]["tps"]["median"] > 0
    share = figures["checked_over_unchecked_tps"]
    assert share["ratio"] == pytest.approx(figures["checked"]["tps"]["median"] / figures["unchecked"]["tps"]["median"])
    # The status vocabularies and the counters' signs of both tables are what was compared ...
    names = {check["name"] for check in figures["checks"]}
    assert {"run_state_status_valid", "run_step_status_valid", "run_state_epoch_check",
            "run_step_attempt_check"} <= names
    assert {(table, name) for table, name, _ in checks_of(DB)} == {(c["table"], c["name"]) for c in figures["checks"]}
    # ... and the copy lacks them alone: the same columns and indexes.
    assert checks_of(f"{DB}_unchecked") == []
    assert columns_and_indexes(f"{DB}_unchecked") == columns_and_indexes(DB)
    assert "check_cost.md" in proc.stdout and "statements/s" in (tmp_path / "check_cost.md").read_text()
