"""bench.statements runs end to end at a tiny size, on its own server with pg_stat_statements: every statement the
load sends is named, and counted as often as a run sends it; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

RUNS = 40
CLAIM = "the claim (a fresh run's first intent in it)"
WRAPPING = "the claim's BEGIN, planner settings and COMMIT"
FOREIGN_KEY = "the foreign key's check of each new attempt's run"
OWN_INTENT = "a first intent on its own (a run claimed ahead)"


def statements(tmp_path, declared: str, *more: str) -> dict:
    command = [sys.executable, "-m", "bench.statements", "--runs", str(RUNS), "--concurrency", "2",
               "--declared", declared, "--out", str(tmp_path), "--name", declared, *more]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (tmp_path / f"{declared}.md").read_text().startswith("# Where PostgreSQL's time goes")
    return json.loads((tmp_path / f"{declared}.json").read_text())["figures"]


def per_run(figures: dict) -> dict[str, float]:
    return {name: k["calls_per_run"] for name, k in figures["kinds"].items()}


def test_each_statement_of_a_run_with_intents_is_named_and_counted(tmp_path):
    figures = statements(tmp_path, "intent")
    calls = per_run(figures)
    # A run of 5 steps: its share of a claim (which takes up to DURABLERUNS_PREFETCH, 4, runs and records their
    # first intents), 4 results each with the next step's intent, and the last result with the run's end; a claim
    # that found nothing adds a little to the claims.
    assert calls["a result, and the next intent"] == 4
    assert calls["the last result, and the run's end"] == 1
    assert 0.25 <= calls[CLAIM] < 0.5
    # The runs a claim took ahead, not begun at once: each records its first intent on its own when it is begun.
    assert 0.5 <= calls[OWN_INTENT] <= 0.75
    assert calls[CLAIM] + calls[OWN_INTENT] >= 1
    # BEGIN, the planner's settings and COMMIT around each claim (and the BEGIN and COMMIT of the pass's few other
    # transactions)
    assert calls[WRAPPING] >= 3 * calls[CLAIM]
    assert calls[FOREIGN_KEY] == 5  # one new attempt per step
    assert not any(name.startswith("results held") for name in calls)
    # The statements inside them: the run's end counts it among the finished runs, once.
    assert any(text.startswith("INSERT INTO run_count") and k["calls_per_run"] == 1
               for text, k in figures["nested"].items())
    assert sum(k["share_of_executor"] for k in figures["kinds"].values()) == pytest.approx(1)
    assert figures["executor_ms_per_step"] > 0 and figures["backend_cpu_ms_per_step"] > 0
    assert all(k["exec_us_per_call"] > 0 for name, k in figures["kinds"].items() if name != WRAPPING)


def test_results_held_in_memory_are_one_statement_per_run(tmp_path):
    calls = per_run(statements(tmp_path, "none"))
    assert calls["results held in memory, and the run's end"] == 1
    assert "a result, and the next intent" not in calls and "the last result, and the run's end" not in calls
    assert calls[FOREIGN_KEY] == 5  # the five rows, written completed in one INSERT
    assert 0.25 <= calls[CLAIM] < 0.5


def test_one_run_a_claim_when_set_so(tmp_path):
    calls = per_run(statements(tmp_path, "intent", "--prefetch", "1"))
    # Each run claimed alone, its first intent in its claim: none recorded on its own.
    assert 1 <= calls[CLAIM] < 1.5 and calls["a result, and the next intent"] == 4
    assert OWN_INTENT not in calls
