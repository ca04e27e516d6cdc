"""bench.bulk runs end to end at tiny sizes (60 failed runs): the API's 202, a --loop worker retrying every run, and
claims timed quiet and beside the bulk. No time is asserted (the published figures are in bench/results/bulk.json)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.postgres


def test_the_bulk_bench_posts_finishes_and_times_claims_beside_it(tmp_path):
    command = [sys.executable, "-m", "bench.bulk", "--db", "dr_bench_smoke_bulk", "--runs", "60", "--workers", "1",
               "--trials", "2", "--rounds", "1", "--claims", "10", "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads((tmp_path / "bulk.json").read_text())
    assert data["runs"] == 60 and data["post"]["trials"] == 2 and data["post"]["median_ms"] > 0
    assert [row["workers"] for row in data["finish"]] == [1] and data["finish"][0]["seconds"] > 0
    assert data["claims"]["rounds"] == 1 and data["claims"]["ratio"] > 0 and data["claims"]["spinning_ratio"] > 0
    assert "POST /api/runs/bulk/" in (tmp_path / "bulk.md").read_text()
