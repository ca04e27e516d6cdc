"""Pickup latency: how soon an idle `--loop` worker starts a run that was just started, listening and polling only.

One `manage.py resume_runs --loop` process with the defaults a user gets (--interval 5, DURABLERUNS_CONCURRENCY
threads) idles on the bench database. The runner then starts runs one at a time with durableruns.start, at random
intervals (uniform, seeded), and right after each start returns reads the database's clock_timestamp() on the
same connection. The latency of a run is its first step's started_at (attempt 1: the claim's transaction time,
with which that intent commits) minus that reading: both ends on the database's clock. The same is measured
with the listener cut: the worker runs with DURABLERUNS_LISTEN=0 (bench.settings), so it polls every --interval
as it does while its listening connection is lost. Both modes run in alternating rounds; each checks the
worker's own first line says how it picks work up.
"""

from __future__ import annotations

import random
import time
from typing import Any

import durableruns
from bench import app
from bench.stats import percentile, rotation, summarize
from bench.workflows import STEP_NAMES, noop9

MODES = {"listening": "1", "polling": "0"}
INTERVAL_S = 5.0  # resume_runs' default --interval, stated here to size the waits


def one_round(dbname: str, *, mode: str, runs: int, rng: random.Random, gap_ms: tuple[float, float]
              ) -> dict[str, Any]:
    """Start ``runs`` runs one at a time while a --loop worker idles; each run's pickup latency in ms."""
    app.reset()
    worker = app.LoopWorker(dbname, "--loop", "--lease", "30",
                            env_extra={"DJANGO_SETTINGS_MODULE": "bench.settings", "DURABLERUNS_LISTEN": MODES[mode]})
    try:
        line = worker.first_line()
        listening = "listening on durableruns_due" in line
        if listening != (mode == "listening"):
            raise RuntimeError(f"the worker for {mode} says: {line}")
        started: dict[str, Any] = {}
        for _ in range(runs):
            time.sleep(rng.uniform(*gap_ms) / 1000)
            run_id = durableruns.start(noop9.name, {})
            [(now,)] = app.execute("SELECT clock_timestamp()")
            started[run_id] = now
        created = dict(app.execute("SELECT run_id, created_at FROM run_state"))
        deadline = time.monotonic() + INTERVAL_S + 60
        first = STEP_NAMES[0]
        while True:
            rows = dict(app.execute("SELECT run_id, started_at FROM run_step WHERE step = %s AND attempt = 1",
                                    [first]))
            if len(rows) >= runs or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        worker.stop()
    if set(rows) != set(started):
        raise RuntimeError(f"{mode}: {len(rows)} of {runs} runs had their first step started in time")
    latencies = [1000 * (rows[run_id] - now).total_seconds() for run_id, now in started.items()]
    since_created = [1000 * (rows[run_id] - created[run_id]).total_seconds() for run_id in started]
    return {"latencies_ms": latencies, "since_created_ms": since_created, "first_line": line.split(": ", 1)[1]}


def measure(*, dbs: Any, runs: int, repeat: int, gap_ms: tuple[float, float] = (20.0, 200.0), seed: int = 13
            ) -> dict[str, Any]:
    """Figure 11: p50/p90/p99 of the pickup latency, listening and with the listener cut."""
    rng = random.Random(seed)
    latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
    since_created: dict[str, list[float]] = {mode: [] for mode in MODES}
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    lines: dict[str, str] = {}
    for _, mode in rotation(list(MODES), repeat):
        result = one_round(dbs.app, mode=mode, runs=runs, rng=rng, gap_ms=gap_ms)
        latencies[mode] += result["latencies_ms"]
        since_created[mode] += result["since_created_ms"]
        rounds[mode].append({q: percentile(result["latencies_ms"], float(q[1:])) for q in ("p50", "p90", "p99")})
        lines[mode] = result["first_line"]
    app.reset()
    figures: dict[str, Any] = {}
    for mode, samples in latencies.items():
        figures[mode] = {
            "latency_ms": summarize(samples),
            "p50_ms": percentile(samples, 50.0), "p90_ms": percentile(samples, 90.0),
            "p99_ms": percentile(samples, 99.0), "max_ms": max(samples), "min_ms": min(samples),
            "rounds": rounds[mode], "worker_says": lines[mode],
            "since_created": {q: percentile(since_created[mode], float(q[1:])) for q in ("p50", "p90", "p99")},
        }
    figures["params"] = {
        "runs_per_round": runs, "rounds": repeat, "gap_ms": list(gap_ms), "seed": seed, "workflow": noop9.name,
        "worker_args": "--loop --lease 30 (defaults: --interval 5, DURABLERUNS_CONCURRENCY threads)",
        "cut": "DURABLERUNS_LISTEN=0: no LISTEN, polling every --interval (and the timer for the next wake time), "
               "as while the listening connection is lost",
        "timing": "first step's run_step.started_at (attempt 1) minus clock_timestamp() read right after "
                  "durableruns.start() returned, both on the database's clock; percentiles over every run of "
                  "every round. A reading can be a little negative: the worker may claim the run before the "
                  "runner, on a busy machine, gets to read the clock. since_created measures instead from the "
                  "run's created_at (the start's INSERT transaction time, before its commit): an upper bound, "
                  "which includes the start's own commit",
    }
    return figures
