"""bench.attributes runs end to end at tiny sizes (200 and 2,000 runs): both databases filled by generate_series,
searches side by side, the plan reading an index of run_attribute. No time is asserted (the 1.5 x limit is for
the published sizes, in bench/results/attributes.json)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.postgres


def test_the_attributes_bench_fills_searches_and_reads_the_index(tmp_path):
    command = [
        sys.executable,
        "-m",
        "bench.attributes",
        "--db",
        "dr_bench_smoke_attributes",
        "--small",
        "200",
        "--large",
        "2000",
        "--queries",
        "10",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads((tmp_path / "attributes.json").read_text())
    assert [row["runs"] for row in data["sizes"]] == [200, 2000]
    assert all(row["uses_index"] and row["queries"] == 10 for row in data["sizes"])
    assert data["ratio"] > 0 and data["server_ratio"] > 0
    assert "run_attribute" in (tmp_path / "attributes.md").read_text()
