"""bench.volume runs end to end at a small size: both records built by COPY (with run_count and its triggers), every
reader timed on each, the query counts equal between the sizes. No timing is asserted (the 1.5x target is for
the published sizes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.pg import recreate_database
from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

DB = "dr_bench_smoke_volume"
READERS = {"claim", "admin_runs_first_page", "admin_runs_status_filter", "admin_runs_search_run_id",
           "admin_run_page", "admin_escalation_queue", "api_runs_first_page", "api_runs_next_page", "runs_health",
           "metrics"}


def test_the_volume_bench_builds_both_records_and_times_every_reader(tmp_path):
    recreate_database(DB)
    command = [sys.executable, "-m", "bench.volume", "--runs", "3000", "--small", "600", "--rounds", "1", "--db", DB,
               "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads((tmp_path / "volume.json").read_text())
    assert set(data["readers"]) == READERS
    for name, row in data["readers"].items():
        assert row["small_ms"] > 0 and row["big_ms"] > 0, (name, row)
        assert row["small_queries"] == row["big_queries"] > 0, (name, row)
    assert all(built["built"] for built in data["schemas"].values())

    # Reused as built: nothing copied again, no index rebuilt.
    again = subprocess.run([*command, "--reuse"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-4000:]
    reused = json.loads((tmp_path / "volume.json").read_text())["schemas"]
    assert [(s["built"], s["index_changes"], s["count_changes"]) for s in reused.values()] == [(False, [], [])] * 2
