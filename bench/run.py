"""Run the benchmark suite on a local PostgreSQL and write results.json, results.md and PNG charts.

    python -m bench.run [--size tiny|full] [--repeat N] [--process-repeat N] [--out bench/results]
                        [--only engine,throughput,claim_cost,loop_tradeoff,boundary,recovery,io_bound,scaling,pickup,map]
                        [--db-prefix PREFIX] [--profile] [--note TEXT]

`--size tiny` checks that everything runs (well under a minute); `--size full` takes the published figures:
10,000 runs for throughput, 1,000,000 finished runs for the claim cost (generated once, then reused), 1,000
crashed runs for recovery, 200 I/O-bound runs against DBOS, concurrency 1 to 128 in one process, 100 runs for
pickup latency. The suite owns its databases (durableruns_bench, dr_bench_app and DBOS's
dbos_bench_sys / dbos_bench_recovery_sys, or `<prefix>_*` with --db-prefix) and never touches the project's.
Run it on a quiet machine: the ratios are measured side by side, but the absolute figures follow the load.
`bin/setup --bench` installs what it needs (the bench extra: PostgreSQL's driver, DBOS, matplotlib) and starts
PostgreSQL.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import app, report
from bench.pg import Databases, server_settings

FIGURES = ("engine", "throughput", "claim_cost", "loop_tradeoff", "boundary", "recovery", "io_bound", "scaling",
           "pickup", "map")
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, kw_only=True)
class Size:
    """Every parameter of one size of the suite."""

    name: str
    repeat: int  # rounds of the in-process figures
    loop_repeat: int  # rounds of the loop trade-off, whose passes take seconds each at full size
    process_repeat: int  # rounds of the figures that start processes (throughput, recovery)
    floor_commits: int  # per round
    engine_runs: int  # 9-step runs per round, for the hand-written floor steps and for durableruns
    dbos_workflows: int  # per round
    throughput_runs: int
    claim_levels: tuple[int, ...]
    claims: int  # pending runs claimed per round at each level
    loop_items: int
    loop_item_seconds: float
    batch_sizes: tuple[int, ...]
    boundary_attempts: tuple[int, ...]
    boundary_calls: int
    recovery_runs: int
    io_runs: int  # I/O-bound runs (5 steps of 20 ms) per round, against DBOS
    io_repeat: int  # its rounds: more than the other process figures, since the 2 cores' noise moves it most
    io_workers: int
    io_concurrency: int
    scaling_levels: tuple[tuple[int, int], ...]  # (--concurrency, runs) for one process
    pickup_runs: int  # runs started one at a time per round, listening and polling
    map_items: int  # ctx.map against ctx.loop: lines per step
    map_item_seconds: float
    map_concurrency: int


SIZES = {
    "tiny": Size(name="tiny", repeat=3, loop_repeat=2, process_repeat=1, floor_commits=50, engine_runs=5, dbos_workflows=5,
                 throughput_runs=200, claim_levels=(0, 1_000, 10_000), claims=50, loop_items=120,
                 loop_item_seconds=0.0005, batch_sizes=(1, 5, 10, 25, 50, 100), boundary_attempts=(1, 10, 100),
                 boundary_calls=5, recovery_runs=20, io_runs=20, io_repeat=1, io_workers=2, io_concurrency=8,
                 scaling_levels=((1, 4), (4, 16)), pickup_runs=8, map_items=240,
                 map_item_seconds=0.005, map_concurrency=16),
    "full": Size(name="full", repeat=10, loop_repeat=5, process_repeat=3, floor_commits=200, engine_runs=20, dbos_workflows=20,
                 throughput_runs=10_000, claim_levels=(0, 100_000, 1_000_000), claims=300, loop_items=240,
                 loop_item_seconds=0.005, batch_sizes=(1, 5, 10, 25, 50, 100), boundary_attempts=(1, 10, 100),
                 boundary_calls=50, recovery_runs=1_000, io_runs=200, io_repeat=5, io_workers=2, io_concurrency=32,
                 scaling_levels=((1, 30), (8, 160), (32, 480), (128, 960)), pickup_runs=100,
                 map_items=240, map_item_seconds=0.05, map_concurrency=16),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="tiny (default) or full")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds of the in-process figures (default: tiny 3, full 10; the loop trade-off "
                             "2 and 5)")
    parser.add_argument("--process-repeat", type=int, default=None,
                        help="rounds of the figures that start processes: throughput, recovery, io_bound, "
                             "scaling, pickup (default: tiny 1, full 3; io_bound 5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default bench/results)")
    parser.add_argument("--only", default=",".join(FIGURES),
                        help=f"comma-separated figures to run (default all: {','.join(FIGURES)})")
    parser.add_argument("--db-prefix", default=None,
                        help="own databases named <prefix>_floor, <prefix>_app, ... (default: the suite's own)")
    parser.add_argument("--profile", action="store_true",
                        help="also write profile.txt: cProfile of durableruns' per-step workload")
    parser.add_argument("--note", default="", help="a line for results.md, e.g. the conditions of the run")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figure(s) {', '.join(sorted(unknown))}; choose from {', '.join(FIGURES)}")
    for name in ("repeat", "process_repeat"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args



def run(size: Size, *, out: Path, only: tuple[str, ...], dbs: Databases, profile: bool, note: str,
        argv: list[str]) -> dict[str, Any]:
    """Measure the chosen figures at ``size`` and write the results into ``out``."""
    began = time.perf_counter()
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "size": size.name, "command": report.reproducing_command("bench.run", argv), "parameters": asdict(size), "databases": asdict(dbs),
        "nproc": os.cpu_count(), "loadavg_start": os.getloadavg(), "python": platform.python_version(),
        "platform": platform.platform(), "postgresql": server_settings(), "git": report.git_described(), "note": note,
    }
    app.configure(dbs.app)
    app.compile_bytecode()
    # The figure modules use durableruns' models, so they are imported once Django is set up.
    from bench import (boundary_cost, claim_cost, engine_cost, io_bound, loop_tradeoff, map_fanout, pickup, recovery,
                       scaling, throughput)

    steps = {
        "engine": lambda: engine_cost.measure(dbs=dbs, repeat=size.repeat, runs=size.engine_runs,
                                              commits=size.floor_commits, dbos_workflows=size.dbos_workflows),
        "throughput": lambda: throughput.measure(dbs=dbs, runs=size.throughput_runs, repeat=size.process_repeat),
        "claim_cost": lambda: claim_cost.measure(levels=size.claim_levels, claims=size.claims, repeat=size.repeat),
        "loop_tradeoff": lambda: loop_tradeoff.measure(items=size.loop_items, item_seconds=size.loop_item_seconds,
                                                       batch_sizes=size.batch_sizes, repeat=size.loop_repeat),
        "boundary": lambda: boundary_cost.measure(attempts=size.boundary_attempts, calls=size.boundary_calls,
                                                  repeat=size.repeat),
        "recovery": lambda: recovery.measure(dbs=dbs, runs=size.recovery_runs, repeat=size.process_repeat),
        "io_bound": lambda: io_bound.measure(dbs=dbs, runs=size.io_runs, workers=size.io_workers,
                                             concurrency=size.io_concurrency, repeat=size.io_repeat),
        "scaling": lambda: scaling.measure(dbs=dbs, levels=size.scaling_levels, repeat=size.process_repeat),
        "pickup": lambda: pickup.measure(dbs=dbs, runs=size.pickup_runs, repeat=size.process_repeat),
        "map": lambda: map_fanout.measure(items=size.map_items, item_seconds=size.map_item_seconds,
                                          concurrency=size.map_concurrency, repeat=size.loop_repeat),
    }
    figures: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for name in FIGURES:
        if name not in only:
            continue
        started = time.perf_counter()
        figures[name] = steps[name]()
        seconds[name] = time.perf_counter() - started
        print(f"bench: {name} done in {seconds[name]:.1f} s", file=sys.stderr, flush=True)
    if profile:
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.txt").write_text(engine_cost.profile(size.engine_runs * size.repeat))
        app.reset()
    meta.update(loadavg_end=os.getloadavg(), figure_seconds=seconds, duration_s=time.perf_counter() - began)
    return report.write(out, meta, figures)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    size = SIZES[args.size]
    overrides = {k: v for k, v in (("repeat", args.repeat), ("loop_repeat", args.repeat),
                                   ("process_repeat", args.process_repeat), ("io_repeat", args.process_repeat))
                 if v}
    if overrides:
        size = Size(**{**asdict(size), **overrides})
    only = tuple(name for name in args.only.split(",") if name)
    results = run(size, out=args.out, only=only, dbs=Databases.named(args.db_prefix), profile=args.profile,
                  note=args.note, argv=argv)
    for target in results["targets"]:
        print(f"{target['verdict']}  {target['name']}: {target['detail']}")
    print(f"wrote {args.out / 'results.json'}, {args.out / 'results.md'} and the charts "
          f"({results['meta']['duration_s']:.0f} s)")


if __name__ == "__main__":
    main()
