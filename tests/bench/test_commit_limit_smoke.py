"""bench.commit_limit runs end to end at a tiny size: every level measured against pgbench, the breakdown counted,
the memory figure sampled; no timing is asserted (the targets are for the published size)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.pg import recreate_database
from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

DB = "dr_bench_smoke_commit"


def test_the_commit_limit_bench_measures_each_level_against_pgbench(tmp_path):
    recreate_database(DB)
    command = [sys.executable, "-m", "bench.commit_limit", "--runs", "40", "--workers", "1,2", "--concurrency", "2",
               "--rounds", "1", "--pgbench-seconds", "1", "--memory-runs", "40", "--db", DB, "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads((tmp_path / "commit_limit.json").read_text())
    levels = data["figures"]["levels"]
    assert set(levels) == {"1", "2"}
    for workers, level in levels.items():
        assert level["clients"] == 2 * int(workers)
        assert level["steps_per_s"]["median"] > 0 and level["pgbench_tps"]["median"] > 0
        ratio = level["steps_per_s"]["median"] / level["pgbench_tps"]["median"]
        assert level["ratio"]["median"] == pytest.approx(ratio)
        # Each run commits at least its claim and its last result: 2 commits for 5 steps at the very least.
        assert level["commits_per_step"]["median"] >= 0.4
        counted = level["counted"]
        assert counted["statements_per_step"] >= counted["round_trips_per_step"] > 0
        assert level["worker_cpu_ms_per_step"]["median"] > 0 and level["pg_cpu_ms_per_step"]["median"] > 0
        assert level["wal_records_per_step"]["median"] > 0
        # Each step finds its attempt by run_step's primary key, never by reading the table: the tables hold a
        # history of completed runs, so PostgreSQL does not plan for an empty run_step (create_pending).
        assert level["run_step_rows_scanned_per_step"]["median"] == 0
        # The record's floor: pgbench chained the step's own statement (floor_round checks every transaction
        # completed the attempt the one before it started), beside the same rounds' durableruns and UPDATEs.
        floor = level["floor"]
        assert floor["tps"]["median"] > 0 and floor["pg_cpu_ms_per_tx"]["median"] > 0
        assert floor["durableruns_over_floor"]["median"] == pytest.approx(
            level["steps_per_s"]["median"] / floor["tps"]["median"])
        assert floor["floor_over_pgbench"]["median"] == pytest.approx(
            floor["tps"]["median"] / level["pgbench_tps"]["median"])
    memory = data["figures"]["memory"]
    assert len(memory["rss_mb_after_batch"]) == memory["batches"] == 10
    assert all(mb > 0 for mb in memory["rss_mb_after_batch"])
    text = (tmp_path / "commit_limit.md").read_text()
    assert "python -m bench.commit_limit" in text and "| 1 | 2 |" in text
    assert "The record's floor" in text


def test_declared_without_intents_a_run_is_its_claim_and_one_commit(tmp_path):
    """The same load with its steps declared intent=False (durableruns.held): the five results share one commit,
    so a run claimed alone (--prefetch 1) commits twice (its claim, its results with its end) where it commits six
    with intents."""
    recreate_database(DB)
    command = [sys.executable, "-m", "bench.commit_limit", "--runs", "40", "--workers", "1", "--concurrency", "2",
               "--rounds", "1", "--pgbench-seconds", "1", "--memory-runs", "0", "--db", DB, "--out", str(tmp_path),
               "--declared", "none", "--prefetch", "1"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads((tmp_path / "commit_limit.json").read_text())
    assert data["meta"]["params"]["declared"] == "none" and data["meta"]["params"]["prefetch"] == 1
    level = data["figures"]["levels"]["1"]
    assert 0.4 <= level["commits_per_step"]["median"] < 0.6  # with intents: about 1.2
    assert "floor" not in level  # the floor is the statement of a step declared with an intent
    assert level["counted"]["round_trips_per_step"] < 0.6
    assert "declared intent=False" in (tmp_path / "commit_limit.md").read_text()
