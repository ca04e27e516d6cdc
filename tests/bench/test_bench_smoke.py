"""The benchmark suite runs end to end at its tiny size and writes every figure; no timing is asserted.

It runs `python -m bench.run --size tiny` (every figure, the I/O-bound, scaling and pickup ones too) as a separate
process on its own databases (prefix dr_bench_smoke, never the database under test), into a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.pg import Databases, recreate_database
from bench.run import FIGURES
from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

CHARTS = ("per_step", "throughput", "claim_cost", "loop_tradeoff", "recovery", "io_bound", "scaling")


def positive(summary: dict[str, Any], what: str) -> None:
    assert {"median", "p10", "p90", "n"} <= set(summary), f"{what} is not a summary: {summary}"
    assert summary["median"] > 0 and summary["n"] >= 1, f"{what}: {summary}"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("bench") / "results"
    # The suite's own app database, made anew: one left by another checkout may carry another migration history.
    recreate_database(Databases.named("dr_bench_smoke").app)
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--size", "tiny", "--out", str(out),
                           "--db-prefix", "dr_bench_smoke"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((out / "results.json").read_text()), out


def test_every_figure_is_written_with_positive_medians(results):
    data, _ = results
    figures = data["figures"]
    assert set(figures) == set(FIGURES)

    engine = figures["engine"]
    for name in ("ms_per_commit_floor", "ms_per_commit_floor_client_side", "ms_per_commit_floor_prepared",
                 "ms_per_step_floor_two_commits", "ms_per_step_floor_one_statement",
                 "ms_per_step_durableruns", "ms_per_step_durableruns_unprepared", "ms_per_step_dbos",
                 "ms_per_step_durableruns_held"):
        positive(engine[name], name)
    for name in ("durableruns_over_floor_commit", "durableruns_over_dbos", "durableruns_over_floor_of_its_commits",
                 "durableruns_prepared_over_unprepared", "durableruns_held_over_floor_commit",
                 "durableruns_held_over_dbos"):
        assert engine[name]["ratio"] > 0
    # A 9-step run: create, claim with the first intent, then one per step (the design allows one more, for a
    # first intent of its own); the boundary reads nothing more (the attempts ride on the claim). The one read is
    # the pass's own look for a bulk's pending runs (durableruns.bulks.drain): once a pass, whatever its runs.
    assert (engine["commits"]["write_commits_per_run"], engine["commits"]["read_transactions_per_run"]) == (11, 1)
    # The target's floor is the faster of the two ways to send a commit.
    assert engine["ms_per_commit_floor"]["median"] == min(engine["ms_per_commit_floor_client_side"]["median"],
                                                          engine["ms_per_commit_floor_prepared"]["median"])

    throughput = figures["throughput"]
    for workers in ("workers_1", "workers_2"):
        for name in ("seconds", "runs_per_s", "steps_per_s"):
            positive(throughput[workers][name], f"throughput {workers} {name}")
    positive(throughput["process_startup_s"], "process start-up")

    levels = figures["claim_cost"]["levels"]
    assert len(levels) == 3
    for n, level in levels.items():
        positive(level["ms_per_claim"], f"claim at {n}")
        assert level["explain"]["plan"] and level["explain"]["queries_per_claim"] >= 1

    loop = figures["loop_tradeoff"]
    assert [row["every"] for row in loop["rows"]] == [1, 5, 10, 25, 50, 100]
    for row in loop["rows"]:
        positive(row["step_s"], f"loop step at b={row['every']}")
        assert row["rework_items"] > 0 and row["rework_s"] > 0
        if row["checkpoints"]:
            positive(row["checkpoint_ms"], f"checkpoint at b={row['every']}")
            positive(row["overhead_timed_pct"], f"timed overhead at b={row['every']}")
    assert loop["item_ms"] > 0 and loop["checkpoint_ms"] > 0 and loop["balance_point"] > 0
    assert loop["model_table"][0].startswith("| every b |")

    boundary = figures["boundary"]["attempts_per_step"]
    assert list(boundary) == ["1", "10", "100"]
    for n, figure in boundary.items():
        positive(figure["ms_per_boundary"], f"boundary with {n} attempts per step")
        assert figure["queries"]["count"] >= 1

    recovery = figures["recovery"]
    for name in ("durableruns_1", "durableruns_2", "dbos"):
        positive(recovery[name]["seconds"], f"recovery {name}")
    assert recovery["durableruns_1_over_dbos"]["ratio"] > 0
    # The bulk-built crashed runs are checked against the record a real SIGKILL leaves.
    fidelity = recovery["crash_fidelity"]
    assert fidelity["same_as_built"] is True and fidelity["record"]["attempts"][-1][2] == "started"

    io = figures["io_bound"]
    for name in ("durableruns_loop", "durableruns", "durableruns_working_span", "dbos"):
        positive(io[name]["seconds"], f"io_bound {name}")
        positive(io[name]["steps_per_s"], f"io_bound {name} steps/s")
    # Net of start-up is a difference of two walls, the --once processes' and an empty process's: at this size the
    # load is within the start-up's noise, and a loaded machine has made it negative. It is what it says it is.
    positive(io["process_startup_s"], "io_bound process start-up")
    net, once = io["durableruns_net_of_startup"]["seconds"], io["durableruns"]["seconds"]
    assert net["n"] == once["n"] == 1  # one round: the median of the differences is the difference of the medians
    # (each of the three is written rounded to 6 decimals)
    assert net["median"] == pytest.approx(once["median"] - io["process_startup_s"]["median"], abs=1e-5)
    assert io["critical_path_s"] == 0.1 and io["durableruns_over_dbos"]["ratio"] > 0
    assert io["ideal_schedule_s"] >= io["critical_path_s"] and io["durableruns_loop_over_ideal"]["median"] > 0
    assert io["durableruns_loop_over_dbos"]["ratio"] > 0
    # The poll that saw every run completed came after the last completion the database recorded.
    assert io["durableruns_loop_polled_s"]["median"] >= io["durableruns_loop"]["seconds"]["median"]
    assert io["params"]["worker_args"].startswith("--once --concurrency ")
    assert io["params"]["loop_worker_args"].startswith("--loop --concurrency ")
    # Where the --loop time went: the starts took part of the span, and each side spent CPU on every step.
    spent = {key: summary["median"] for key, summary in io["durableruns_loop_spent"].items()}
    assert 0 < spent["starting_s"] <= io["durableruns_loop_polled_s"]["median"], spent
    assert min(spent["workers_cpu_ms_per_step"], spent["server_cpu_ms_per_step"], spent["starter_cpu_ms_per_step"]) > 0
    assert spent["cpu_floor_s"] == pytest.approx(spent["cpu_s"] / os.cpu_count(), rel=0.01), spent

    scaling = figures["scaling"]
    levels = scaling["levels"]
    assert list(levels) == ["1", "4"]
    for n, level in levels.items():
        for name in ("steps_per_s", "span_s", "wall_s", "cpu_s", "peak_rss_mb"):
            positive(level[name], f"scaling at {n}: {name}")
        # N threads and the heartbeat, never more; the sampler saw the worker connected.
        assert 1 <= level["max_connections"] <= int(n) + 1
        assert 0 <= level["lock_wait_share"]["median"] <= 1 and 0 <= level["machine_cpu_busy"]["median"] <= 1
        assert level["limited_by"]

    fanout = figures["map"]
    for name in ("map_s", "map_call_s", "loop_s"):
        positive(fanout[name], name)
    assert fanout["map_over_ideal"]["ratio"] > 0 and fanout["map_over_loop"]["ratio"] > 0

    pickup = figures["pickup"]
    assert "listening on durableruns_due" in pickup["listening"]["worker_says"]
    assert "listening" not in pickup["polling"]["worker_says"]
    for mode in ("listening", "polling"):
        assert pickup[mode]["latency_ms"]["n"] == 8
        assert pickup[mode]["p50_ms"] <= pickup[mode]["p90_ms"] <= pickup[mode]["p99_ms"] <= pickup[mode]["max_ms"]


def test_the_report_states_targets_and_machine(results):
    data, _ = results
    assert len(data["targets"]) == 13
    assert any("declared intent=False" in str(target) for target in data["targets"])  # issue 34's held steps
    assert {t["verdict"] for t in data["targets"]} <= {"PASS", "MISS"}
    meta = data["meta"]
    assert meta["size"] == "tiny" and meta["nproc"] >= 1
    assert {"server_version", "fsync", "synchronous_commit"} <= set(meta["postgresql"])


def test_markdown_and_charts_exist(results):
    _, out = results
    text = (out / "results.md").read_text()
    assert "## Targets" in text and "python -m bench.run --size tiny" in text
    for chart in CHARTS:
        path = out / f"{chart}.png"
        assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({chart}.png)" in text


def test_python_m_bench_report_renders_the_results_again(results):
    """`python -m bench.report results.json` re-renders results.md and the charts (every helper it needs is
    defined before it runs as a script)."""
    _, out = results
    (out / "results.md").unlink()
    proc = subprocess.run([sys.executable, "-m", "bench.report", str(out / "results.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = (out / "results.md").read_text()
    assert "Claims that found nothing" in text and "where the --loop time went" in text
