"""The in-process 9-step run of bench.engine_cost alone, this checkout against another, pair by pair.

    python -m bench.engine_ab --baseline /path/to/other/checkout [--pairs 10] [--runs 1500] [--warmup 200]
                              [--declared intent|none] [--db dr_bench_engine]

Each pair is two fresh processes, one of each checkout, in alternating order, each on a database of its own made
anew at the start and migrated by its own checkout; each process works `--warmup` runs (its statements prepared
and planned), then times `--runs` more: services.start_run, then services.resume_due in that process. With
`--declared none` the steps are declared intent=False (their nine results share one commit). The machine's drift
moves both sides of a pair alike, so the ratio is taken pair by pair; its median is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import app
from bench.pg import recreate_database


# A process of either checkout: it imports that checkout's durableruns and bench (its directory is the first entry of
# sys.path), so the baseline needs no code of this one; bench.engine_cost.run_once and bench.workflows' noop9 and
# noop9_held exist in every checkout since 617a15d.
_TIMED = """
import json, sys, time
import durableruns
from bench import app
app.configure(sys.argv[1])
from bench import engine_cost, workflows
workflow = workflows.noop9_held.name if sys.argv[2] == "none" else workflows.noop9.name
for _ in range(int(sys.argv[3])):
    engine_cost.run_once(workflow)
began = time.perf_counter()
for _ in range(int(sys.argv[4])):
    engine_cost.run_once(workflow)
print(json.dumps({"ms_per_run": (time.perf_counter() - began) / int(sys.argv[4]) * 1000,
                  "durableruns": durableruns.__file__}))
"""


def timed_process(root: Path, dbname: str, *, declared: str, warmup: int, runs: int) -> dict[str, Any]:
    """One fresh process of the checkout at `root` on `dbname`: its milliseconds per run, and the durableruns it
    imported (which must be that checkout's)."""
    env = dict(os.environ, PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", _TIMED, dbname, declared, str(warmup), str(runs)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the timed process of {root} failed: {done.stderr[-2000:]}")
    timed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(timed["durableruns"]).resolve().is_relative_to(root):
        raise RuntimeError(f"the process of {root} imported durableruns from {timed['durableruns']}")
    return timed


def against(baseline: Path, *, pairs: int, declared: str, warmup: int, runs: int, db: str) -> dict[str, Any]:
    """`pairs` pairs of processes, this checkout's and the baseline's, each on a database of its own made anew."""
    baseline, this_db, base_db = baseline.resolve(), db, f"{db}_baseline"
    for name in (this_db, base_db):
        recreate_database(name)
    ours: list[float] = []
    theirs: list[float] = []
    ratios: list[float] = []
    imported: dict[str, str] = {}
    for pair in range(pairs):
        order = [("this", app.ROOT, this_db, ours), ("baseline", baseline, base_db, theirs)]
        for side, root, dbname, into in order if pair % 2 == 0 else order[::-1]:
            timed = timed_process(root, dbname, declared=declared, warmup=warmup, runs=runs)
            into.append(float(timed["ms_per_run"]))
            imported[side] = timed["durableruns"]
        ratios.append(ours[-1] / theirs[-1])
    return {"ms_per_run": statistics.median(ours), "baseline_ms_per_run": statistics.median(theirs),
            "over_baseline": statistics.median(ratios), "over_baseline_low": min(ratios),
            "over_baseline_high": max(ratios), "pairs": pairs, "imported": imported}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_ab",
                                     description="The in-process 9-step run, this checkout against another.")
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of the project")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--runs", type=int, default=1500, help="timed runs per process")
    parser.add_argument("--warmup", type=int, default=200, help="runs per process before the timed ones")
    parser.add_argument("--declared", choices=("intent", "none"), default="intent",
                        help="the no-op steps with their intents (default), or declared intent=False (none)")
    parser.add_argument("--db", default="dr_bench_engine")
    args = parser.parse_args(argv)
    found = against(args.baseline, pairs=args.pairs, declared=args.declared, warmup=args.warmup,
                    runs=args.runs, db=args.db)
    print(f"{args.declared}: {found['ms_per_run']:.3f} ms per run against {found['baseline_ms_per_run']:.3f}; "
          f"this / baseline {found['over_baseline']:.3f} (pairs {found['over_baseline_low']:.3f}-"
          f"{found['over_baseline_high']:.3f}, {found['pairs']} pairs)")
    print(f"this: {found['imported']['this']}; baseline: {found['imported']['baseline']}")


if __name__ == "__main__":
    main()
