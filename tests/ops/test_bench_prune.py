"""bench/prune.py runs end to end at a tiny size on its own database, and checks what it pruned; no timing is
asserted (the figures are bench/results/prune.md's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.postgres


def run_bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.prune",
            "--runs",
            "300",
            "--db",
            "dr_bench_prune_smoke",
            "--out",
            str(out),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_the_prune_bench_prunes_the_old_runs_beside_a_claimer(tmp_path: Path):
    figures = run_bench(tmp_path, "--baseline-seconds", "1", "--batch-size", "100")
    assert figures["runs"] == 300 and figures["attempts"] == 900 and figures["young_kept"] == 30
    assert figures["claim_baseline"]["n"] >= 1 and figures["claim_during_prune"]["n"] >= 1
    assert figures["prune_s"] > 0


def test_the_readers_bench_reports_each_reader_and_its_plans(tmp_path: Path):
    figures = run_bench(tmp_path, "--queries")
    readers = figures["readers"]
    assert set(readers) == {
        "metrics view (render_record)",
        "dashboard (build)",
        "runs_health checks (escalation, due, stuck)",
    }
    assert readers["dashboard (build)"]["queries"] == 6
    assert all(reader["plans"] and reader["median_ms"] > 0 for reader in readers.values())


def test_the_prune_bench_runs_two_claimers_and_samples_lock_waits(tmp_path: Path):
    figures = run_bench(tmp_path, "--baseline-seconds", "2", "--batch-size", "100", "--claimers", "2")
    assert figures["claimers"] == 2 and figures["young_kept"] == 30
    assert figures["claim_baseline"]["n"] >= 2 and figures["claim_during_prune"]["n"] >= 2
    for phase in ("lock_waits_baseline", "lock_waits_during_prune"):
        waits = figures[phase]
        assert waits["samples"] >= 1 and 0 <= waits["samples_with_a_waiter"] <= waits["samples"]
        assert waits["max_wait_s"] < 1.0, waits  # no lock held past a batch, or a claimer's short fenced write
    assert figures["p99_during_over_baseline"] > 0
