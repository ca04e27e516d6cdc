"""Resume throughput: how fast `manage.py resume_runs` worker processes drain a backlog of pending runs.

Each round records ``runs`` pending 9-step no-op runs in bulk (the rows services.start_run writes), starts 1 or
2 worker processes at once (--limit big, --lease 30), and takes the wall time from starting them until the last
exits, which it does when nothing is due any more, i.e. every run is completed. Nothing is subtracted; the
fixed cost of a worker process (interpreter, Django set-up, one empty pass) is measured and reported apart.
"""

from __future__ import annotations

from typing import Any

from bench import app, records
from bench.pg import Databases
from bench.stats import summarize
from bench.workflows import NOOP_STEPS


def one_round(dbname: str, *, runs: int, workers: int) -> float:
    """Seconds for ``workers`` processes to complete ``runs`` pending runs (checked afterwards)."""
    app.reset()
    records.create_pending(runs)
    seconds = app.work_all(dbname, workers).seconds
    counts = app.status_counts()
    if counts != {"completed": runs}:
        raise RuntimeError(f"{workers} worker(s) left the runs as {counts}, expected {runs} completed")
    return seconds


def measure(*, dbs: Databases, runs: int, repeat: int, worker_counts: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    """Figure 4: runs/s and steps/s for each worker count, rounds alternating between the counts."""
    seconds: dict[int, list[float]] = {n: [] for n in worker_counts}
    startup = [app.startup_seconds(dbs.app) for _ in range(repeat)]
    for round_no in range(repeat):
        order = worker_counts if round_no % 2 == 0 else tuple(reversed(worker_counts))
        for n in order:
            seconds[n].append(one_round(dbs.app, runs=runs, workers=n))
    app.reset()
    figures: dict[str, Any] = {}
    for n, samples in seconds.items():
        figures[f"workers_{n}"] = {
            "seconds": summarize(samples),
            "runs_per_s": summarize([runs / s for s in samples]),
            "steps_per_s": summarize([runs * NOOP_STEPS / s for s in samples]),
        }
    figures["process_startup_s"] = summarize(startup)
    figures["params"] = {"runs": runs, "steps_per_run": NOOP_STEPS, "rounds": repeat,
                         "worker_args": f"--limit {app.BIG_LIMIT} --lease 30",
                         "timing": "wall time from starting the processes until the last exited (all completed); "
                                   "process start-up is included, and reported apart as process_startup_s"}
    return figures
