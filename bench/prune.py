"""Retention under load: prune N finished runs while a worker keeps claiming and working new ones.

The finished runs are built in bulk in SQL (generate_series, as bench/claim_cost.py does): N runs finished 40 days
ago, each with three completed attempts, plus a tenth as many finished yesterday (kept) so the pass has rows to
walk past. A separate claimer process (`python -m bench.prune --claimer`) records a fresh run and then, in a loop,
times store.claim and works the claimed run through its nine no-op steps, recording the next one as it goes: first
for a baseline with no prune running, then while `prune_runs --older-than 30` deletes the N runs. The figures are
the prune's wall time and rate, and the claim latency's percentiles in both phases.

    python -m bench.prune --runs 200000 [--db h16_bench_prune] [--out bench/results/prune.json]
    nice -n 10 python -m bench.prune --runs 1000000 --claimers 2 [--reuse]   # two workers beside the prune

With --claimers N, N claimer processes work side by side in both phases (a claim that finds the run it recorded
taken by another is timed too). Meanwhile a thread samples pg_locks every 50 ms for any backend of the bench
database waiting on a lock (pg_locks.waitstart): the longest wait seen, in each phase.

With --queries it times instead what operators' tools read on a record of that size (with a few hundred active
runs, attempts in doubt and open escalations beside the finished ones): the metrics view's gauges, the admin
dashboard's charts and runs_health's checks, each the median of several reads, with the plan of each query.

    python -m bench.prune --runs 1000000 --queries
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import app
from bench.stats import percentile

DEFAULT_DB = "dr_bench_prune"
ATTEMPTS = 3


def build(runs: int) -> None:
    """Record `runs` runs finished 40 days ago with ATTEMPTS completed attempts each, and runs/10 finished
    yesterday; then VACUUM ANALYZE, as a table that grew over months would be."""
    from bench.workflows import noop9

    app.reset()
    for prefix, count, age in (("old", runs, "40 days"), ("young", max(1, runs // 10), "1 day")):
        app.execute(
            "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
            "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
            f"SELECT '{prefix}-' || lpad(g::text, 8, '0'), %s, %s, "
            "(ARRAY['completed', 'completed', 'completed', 'failed', 'cancelled'])[1 + g %% 5], 9, 'bench', 1, "
            f"NULL, NULL, '', '{{\"order\": 1}}'::jsonb, now() - interval '{age}' - interval '1 hour', "
            f"now() - interval '{age}' FROM generate_series(1, %s) g",
            [noop9.name, noop9.fingerprint, count])
        app.execute(
            "INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, finished_at, result, "
            "error, resolution, owner, epoch, loop_cursor, progress) "
            f"SELECT '{prefix}-' || lpad(g::text, 8, '0'), 'step_' || s, 1, 'completed', "
            f"'{prefix}-' || g || ':step_' || s, now() - interval '{age}', now() - interval '{age}', "
            "'{\"ok\": true}'::jsonb, '', 'returned', 'bench', 1, 0, '{}'::jsonb "
            f"FROM generate_series(1, %s) g, generate_series(1, {ATTEMPTS}) s",
            [count])
    app.execute("VACUUM ANALYZE run_state")
    app.execute("VACUUM ANALYZE run_step")


def claimer(seconds: float, out: Path, *, shared: bool = False) -> None:
    """In this process: claim and work one fresh run after another for `seconds`, or until a file named like
    `out` with `.stop` appended appears; then write each claim's latency to `out`. With `shared` (other claimers
    run beside it), a claim that finds the run it recorded taken by another is timed too, and not an error."""
    from durableruns import services, store
    from durableruns.engine import Engine
    from durableruns.registry import first_steps

    samples: list[float] = []
    end = time.monotonic() + seconds
    stop = out.with_name(out.name + ".stop")
    out.with_name(out.name + ".ready").touch()  # set up: the prune may start
    with Engine() as engine:
        while time.monotonic() < end and not stop.exists():
            services.start_run("bench_noop9", {})
            began = time.perf_counter()
            claimed = store.claim(owner=f"bench-claimer-{os.getpid()}", lease_seconds=30, first_steps=first_steps())
            samples.append(time.perf_counter() - began)
            if claimed is None:
                if not shared:
                    raise RuntimeError("nothing to claim right after recording a run")
                continue  # another claimer took the run this one recorded: a claim all the same
            engine.work(claimed)
    out.write_text(json.dumps(samples))


def _start_claimer(dbname: str, seconds: float, out: Path, *, shared: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.prune", "--db", dbname, "--claimer", str(seconds),
                             "--samples", str(out), *(["--shared"] if shared else [])], cwd=app.ROOT,
                            env=dict(os.environ, **app.site_env(dbname)), text=True)


def _claimers(dbname: str, count: int, seconds: float, out: Path) -> list[tuple[subprocess.Popen[str], Path]]:
    """Start `count` claimer processes, each writing its samples to `out` with its number appended."""
    files = [out.with_name(f"{out.stem}-{i}.json") for i in range(count)]
    return [(_start_claimer(dbname, seconds, f, shared=count > 1), f) for f in files]


def _collect(started: list[tuple[subprocess.Popen[str], Path]], what: str) -> list[float]:
    samples: list[float] = []
    for proc, file in started:
        if proc.wait() != 0:
            raise RuntimeError(f"a claimer {what} failed")
        samples.extend(json.loads(file.read_text()))
    return samples


class LockWaits:
    """Samples pg_locks every `every` seconds from its own connection, in a thread: the longest any backend of
    the bench database has waited for a lock (pg_locks.waitstart, PostgreSQL 14+), and how many samples saw one
    waiting. What log_lock_waits would log past deadlock_timeout, read without changing the shared server."""

    def __init__(self, dbname: str, every: float = 0.05) -> None:
        import threading

        import psycopg

        from bench.pg import conninfo

        self._conn = psycopg.connect(conninfo(dbname), autocommit=True)
        self._every = every
        self._stop = threading.Event()
        self.samples = 0
        self.waiting_samples = 0
        self.max_wait_s = 0.0
        self.worst: list[Any] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            row = self._conn.execute(
                "SELECT extract(epoch FROM clock_timestamp() - l.waitstart), l.locktype, l.mode, "
                "l.relation::regclass::text, a.query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database() AND l.waitstart IS NOT NULL "
                "ORDER BY l.waitstart LIMIT 1").fetchone()
            self.samples += 1
            if row is None:
                continue
            self.waiting_samples += 1
            if float(row[0]) > self.max_wait_s:
                self.max_wait_s = float(row[0])
                self.worst = [round(float(row[0]), 3), row[1], row[2], row[3], (row[4] or "")[:200]]

    def __enter__(self) -> LockWaits:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()

    def figures(self) -> dict[str, Any]:
        return {"samples": self.samples, "samples_with_a_waiter": self.waiting_samples,
                "max_wait_s": round(self.max_wait_s, 3), "worst": self.worst}


def _latency(samples: list[float]) -> dict[str, Any]:
    ms = [s * 1e3 for s in samples]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 3), "p95_ms": round(percentile(ms, 95), 3),
            "p99_ms": round(percentile(ms, 99), 3), "max_ms": round(max(ms), 3)}


def add_live(pending: int = 1000, crashed: int = 100, escalated: int = 50) -> None:
    """Beside the finished runs: pending runs, runs whose worker died in step 2 (lease expired, attempt started),
    and runs stopped on an open escalation of their step 3."""
    from bench.workflows import noop9

    app.execute(
        "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
        "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
        "SELECT 'live-' || g, %s, %s, CASE WHEN g <= %s THEN 'pending' WHEN g <= %s THEN 'running' "
        "ELSE 'needs_decision' END, 1, 'gone', 1, CASE WHEN g > %s AND g <= %s THEN now() - interval '1 minute' "
        "END, NULL, '', '{}'::jsonb, now() - interval '2 hours', now() - interval '10 minutes' "
        "FROM generate_series(1, %s) g",
        [noop9.name, noop9.fingerprint, pending, pending + crashed, pending, pending + crashed,
         pending + crashed + escalated])
    app.execute(
        "INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, finished_at, result, error, "
        "resolution, owner, epoch, loop_cursor, progress) "
        "SELECT 'live-' || g, 'step_3', 1, 'started', 'live-' || g || ':step_3', now() - interval '20 minutes', "
        "NULL, NULL, '', '', 'gone', 1, 0, '{}'::jsonb FROM generate_series(%s, %s) g",
        [pending + 1, pending + crashed + escalated])
    app.execute(
        "INSERT INTO run_escalation (run_id, step, attempt, effect_key, in_doubt_since, opened_at, reason) "
        "SELECT 'live-' || g, 'step_3', 1, 'live-' || g || ':step_3', now() - interval '20 minutes', "
        "now() - interval '15 minutes', 'bench' FROM generate_series(%s, %s) g",
        [pending + crashed + 1, pending + crashed + escalated])
    app.execute("VACUUM ANALYZE run_state")
    app.execute("VACUUM ANALYZE run_step")


def time_readers(runs: int, *, repeat: int = 7) -> dict[str, Any]:
    """Median milliseconds of each operator's read on a record of `runs` finished runs plus live ones, and the
    plans of the queries each sends."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durableruns.clock import Clock
    from durableruns.ops import dashboard, health, metrics

    build(runs)
    add_live()
    now = Clock().now()
    readers = {
        "metrics view (render_record)": lambda: metrics.render_record(),
        "dashboard (build)": lambda: dashboard.build(),
        "runs_health checks (escalation, due, stuck)": lambda: (
            health.check_escalations(now, health.thresholds("escalation")),
            health.check_due(now, health.thresholds("due")),
            health.check_stuck(now, health.thresholds("stuck"))),
    }
    result: dict[str, Any] = {"finished_runs": runs, "attempts": runs * ATTEMPTS + 150, "readers": {}}
    for name, read in readers.items():
        read()  # warm: plans and caches as a scraper's second visit finds them
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            read()
            times.append((time.perf_counter() - began) * 1e3)
        with CaptureQueriesContext(connection) as seen:
            read()
        plans = []
        for query in seen.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT") or "clock_timestamp()" in sql:
                continue
            [(plan,)] = app.execute("EXPLAIN (FORMAT JSON) " + sql)
            plans.append(_nodes(plan[0]["Plan"]))
        result["readers"][name] = {"median_ms": round(sorted(times)[len(times) // 2], 2),
                                   "queries": len(seen.captured_queries), "plans": plans}
    return result


def _nodes(plan: dict[str, Any]) -> str:
    """A plan as its nodes, outermost first: 'Aggregate > Index Only Scan run_state_workflow_status_idx'."""
    here = plan["Node Type"] + (f" {plan['Index Name']}" if "Index Name" in plan else "") + (
        f" {plan['Relation Name']}" if "Relation Name" in plan and "Index Name" not in plan else "")
    children = [_nodes(child) for child in plan.get("Plans", [])]
    return here + (" > (" + "; ".join(children) + ")" if children else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--db", default=DEFAULT_DB)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--baseline-seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--queries", action="store_true", help="Time the operators' reads instead of a prune.")
    parser.add_argument("--claimers", type=int, default=1,
                        help="claimer processes working beside the prune (2: two workers); default 1")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the old runs already built at --runs (a run that pruned them builds anew)")
    parser.add_argument("--claimer", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    app.configure(args.db)
    import bench.workflows  # noqa: F401  registers bench_noop9 in this process

    if args.claimer is not None:
        claimer(args.claimer, args.samples, shared=args.shared)
        return
    if args.queries:
        figures = time_readers(args.runs)
        if args.out is not None:
            args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(json.dumps(figures, indent=2))
        return
    if args.claimers < 1:
        parser.error("--claimers must be at least 1")
    print(json.dumps(run(args.db, args.runs, batch_size=args.batch_size, baseline_seconds=args.baseline_seconds,
                         out=args.out, claimers=args.claimers, reuse=args.reuse), indent=2))


def _built(runs: int) -> bool:
    """Whether the database holds exactly the old and young runs build(runs) records, and nothing else."""
    counts = app.execute("SELECT count(*) FILTER (WHERE run_id LIKE 'old-%%'), "
                         "count(*) FILTER (WHERE run_id LIKE 'young-%%'), count(*) FROM run_state")[0]
    return counts == (runs, max(1, runs // 10), runs + max(1, runs // 10))


def run(dbname: str, runs: int, *, batch_size: int, baseline_seconds: float, out: Path | None, claimers: int = 1,
        reuse: bool = False) -> dict[str, Any]:
    """Build, time a baseline of claims, then prune while claiming; return (and write to `out`) the figures.

    `claimers` processes claim and work side by side in both phases; a thread samples the lock waits of the
    bench database's backends in both."""
    import tempfile

    from django.core.management import call_command

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        began = time.perf_counter()
        reused = reuse and _built(runs)
        if not reused:
            build(runs)
        built = time.perf_counter() - began
        with LockWaits(dbname) as baseline_locks:
            baseline = _collect(_claimers(dbname, claimers, baseline_seconds, workdir / "baseline.json"),
                                "in the baseline")
        # The claimers of the second phase start a moment before the prune and are told to stop when it returns.
        with LockWaits(dbname) as prune_locks:
            during = _claimers(dbname, claimers, 36_000, workdir / "during.json")
            deadline = time.monotonic() + 120
            while not all(f.with_name(f.name + ".ready").exists() for _, f in during):
                if time.monotonic() > deadline or any(proc.poll() is not None for proc, _ in during):
                    raise RuntimeError("a claimer did not start")
                time.sleep(0.1)
            time.sleep(1.0)
            began = time.perf_counter()
            with open(os.devnull, "w") as devnull:
                call_command("prune_runs", "--older-than", "30", "--batch-size", str(batch_size), stdout=devnull)
            pruned = time.perf_counter() - began
            for _, file in during:
                file.with_name(file.name + ".stop").touch()
            during_samples = _collect(during, "during the prune")
        result: dict[str, Any] = {
            "runs": runs, "attempts": runs * ATTEMPTS, "build_s": round(built, 1), "reused": reused,
            "prune_s": round(pruned, 2), "runs_per_s": round(runs / pruned), "batch_size": batch_size,
            "claimers": claimers,
            "claim_baseline": _latency(baseline),
            "claim_during_prune": _latency(during_samples),
            "lock_waits_baseline": baseline_locks.figures(),
            "lock_waits_during_prune": prune_locks.figures(),
        }
        result["p99_during_over_baseline"] = round(result["claim_during_prune"]["p99_ms"]
                                                   / result["claim_baseline"]["p99_ms"], 2)
    leftover = app.execute("SELECT count(*) FROM run_state WHERE run_id LIKE 'old-%%'")[0][0]
    leftover_steps = app.execute("SELECT count(*) FROM run_step WHERE run_id LIKE 'old-%%'")[0][0]
    if leftover or leftover_steps:
        raise RuntimeError(f"the prune left {leftover} old runs and {leftover_steps} of their attempts")
    result["young_kept"] = app.execute("SELECT count(*) FROM run_state WHERE run_id LIKE 'young-%%'")[0][0]
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
