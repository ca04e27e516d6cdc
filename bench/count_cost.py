"""What run_count's triggers cost a write, with the triggers and without (dropped, not disabled: a disabled DELETE
trigger still has its transition table captured).

- finish: a pending run's UPDATE to completed in its own transaction (the one write of a run's life that fires a
  trigger; a claim, a step's result or a lease renewal does not: their WHEN is false), run under EXPLAIN ANALYZE,
  so the server reports the statement's execution time and the trigger's own time: figures of the server's work
  alone, without the client's round trip or the commit's flush, whose noise on a shared machine is far larger.
- step: the write of a step's result (status set to running, unchanged, cursor moved): the WHEN is false, so the
  function is never called; it shows what a write that does not finish a run pays (nothing, within noise).
- prune: one DELETE of 1,000 completed runs (a prune's batch), the same way: the statement trigger reads them as a
  transition table and upserts once per workflow and status.
- run: a nine-step no-op run end to end through the engine (bench.engine_cost.run_once: start_run, then a resume
  pass: claim, intents, results, completion) in this process, timed from the client, in rotating rounds; after
  each switch of the triggers one untimed run first (the DDL makes the connection plan its statements again).

    nice -n 10 python -m bench.count_cost [--rounds 30] [--db dr_bench_count_cost] [--out bench/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench import app

DEFAULT_DB = "dr_bench_count_cost"
FINISHES = 200  # finishing UPDATEs per timed call
RUNS = 10  # engine runs per timed call
BATCH = 1000  # runs per prune DELETE


def _definitions() -> list[str]:
    return [row[0] for row in app.execute(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'public.run_state'::regclass "
        "AND tgname LIKE 'run_state_count_%' ORDER BY tgname")]


def triggers(on: bool, definitions: list[str]) -> None:
    """Create run_count's triggers on run_state (`on`) or drop them."""
    for definition in definitions:
        name = definition.split()[2]
        app.execute(f"DROP TRIGGER IF EXISTS {name} ON public.run_state")
        if on:
            app.execute(definition)


def _insert(n: int, status: str, prefix: str) -> list[str]:
    rows = app.execute(
        "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, ending, "
        "input, priority, queue, created_at, updated_at) SELECT %s || g, 'bench_noop9', 'fp', %s, 0, '', 0, '', '', "
        "'{}'::jsonb, 0, 'default', now(), now() FROM generate_series(1, %s) g RETURNING run_id", [prefix, status, n])
    return [r[0] for r in rows]


def _explained(statement: str, params: list[Any]) -> tuple[float, float]:
    """(execution ms, the run_state_count triggers' ms) of one statement, executed under EXPLAIN ANALYZE."""
    plan = app.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)[0][0][0]
    trigger = sum(t["Time"] for t in plan.get("Triggers", []) if t["Trigger Name"].startswith("run_state_count_"))
    return float(plan["Execution Time"]), float(trigger)


def server_side(definitions: list[str], *, rounds: int) -> dict[str, Any]:
    """Median execution and trigger ms of a finishing UPDATE and of a 1,000-run DELETE, with and without."""
    import statistics

    samples: dict[str, list[tuple[float, float]]] = {}
    for r in range(rounds):
        for on in ((True, False) if r % 2 else (False, True)):
            label = "with" if on else "without"
            app.clear()
            triggers(False, definitions)
            pending = _insert(FINISHES, "running", f"f{r}{label}-")
            done = _insert(BATCH, "completed", f"d{r}{label}-")
            triggers(on, definitions)
            _explained("UPDATE run_state SET status = 'running' WHERE run_id = %s", [pending[0]])  # plan it
            for run_id in pending[1:]:
                # A step's write (status set, unchanged: the WHEN is false, no call), then the finish.
                samples.setdefault(f"step_{label}", []).append(_explained(
                    "UPDATE run_state SET status = 'running', cursor = cursor + 1, updated_at = now() "
                    "WHERE run_id = %s", [run_id]))
                samples.setdefault(f"finish_{label}", []).append(_explained(
                    "UPDATE run_state SET status = 'completed', updated_at = now() WHERE run_id = %s", [run_id]))
            samples.setdefault(f"prune_{label}", []).append(
                _explained("DELETE FROM run_state WHERE run_id = ANY(%s)", [done]))
    out = {}
    for name, rows in samples.items():
        per = BATCH if name.startswith("prune") else 1
        out[name] = {"n": len(rows), "execution_ms": round(statistics.median(e for e, _ in rows), 4),
                     "trigger_ms": round(statistics.median(t for _, t in rows), 4),
                     "execution_us_per_run": round(statistics.median(e for e, _ in rows) * 1e3 / per, 2),
                     "trigger_us_per_run": round(statistics.median(t for _, t in rows) * 1e3 / per, 2)}
    return out


def engine(definitions: list[str], *, rounds: int) -> dict[str, Any]:
    """ms per nine-step run through the engine, with and without, in rotating rounds."""
    from bench.engine_cost import run_once
    from bench.stats import Workload, interleave

    def switch(on: bool) -> None:
        app.clear()
        triggers(on, definitions)
        run_once()  # untimed: the connection plans its statements again after the DDL

    def runs(_: Any) -> None:
        for _ in range(RUNS):
            run_once()

    ms = interleave([Workload(name="with", run=runs, ops=RUNS, setup=lambda: switch(True)),
                     Workload(name="without", run=runs, ops=RUNS, setup=lambda: switch(False))], repeat=rounds)
    return {name: {k: round(v, 3) for k, v in summary.items()} for name, summary in ms.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.count_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=DEFAULT_DB, help=f"the bench's own database (default {DEFAULT_DB})")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="write count_cost.json there")
    args = parser.parse_args(argv)
    app.configure(args.db)
    import bench.workflows  # noqa: F401  registers bench_noop9 in this process

    definitions = _definitions()
    if len(definitions) != 4:
        raise RuntimeError(f"expected run_count's four triggers on public.run_state, found {definitions}")
    try:
        statements = server_side(definitions, rounds=args.rounds)
        runs = engine(definitions, rounds=args.rounds)
    finally:
        app.clear()
        triggers(True, definitions)
    result = {"command": "nice -n 10 python -m bench.count_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "rounds": args.rounds, "loadavg": os.getloadavg(), "statements": statements,
              "engine_ms_per_run": runs, "runs_per_timed_call": RUNS, "finishes_per_round": FINISHES - 1,
              "runs_per_delete": BATCH}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "count_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, row in statements.items():
        print(f"{name}: execution {row['execution_us_per_run']} us per run, the triggers {row['trigger_us_per_run']} "
              f"us per run (median of {row['n']})")
    for name, summary in runs.items():
        print(f"engine {name}: {summary['median']:.2f} ms per nine-step run (p10 {summary['p10']:.2f}, "
              f"p90 {summary['p90']:.2f})")
    return result


if __name__ == "__main__":
    main()
