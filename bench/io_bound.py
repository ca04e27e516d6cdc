"""I/O-bound throughput against DBOS: many runs whose steps wait on far calls, worked concurrently.

Each round records ``runs`` pending runs of bench.workflows.io5 (5 steps, each a 20 ms time.sleep standing for a
far call) in bulk, starts ``workers`` `manage.py resume_runs --once --concurrency N` processes at once, and takes
the wall time from starting them until the last exits, which each does when nothing is due any more (checked:
every run completed, every step once). Process start-up is included, and measured apart in the same round (an
empty resume_runs process). DBOS Transact, in rounds alternating with these, gets the same work in one fresh
process: the same number of 5-step workflows sleeping 20 ms a step, all started at once with DBOS.start_workflow
on its default executor, timed from the first start until every handle's result is in (DBOS launched first,
untimed). The critical path, one run alone with nothing else to do, is 5 x 20 ms.
"""

from __future__ import annotations

from typing import Any

from bench import app, dbos_baseline, records
from bench.pg import Databases
from bench.stats import ratio, rotation, summarize
from bench.workflows import IO_STEP_SECONDS, IO_STEPS, io5

CRITICAL_PATH_S = IO_STEPS * IO_STEP_SECONDS


def worker_args(concurrency: int) -> tuple[str, ...]:
    return ("--once", "--concurrency", str(concurrency), "--lease", "30")


def one_round(dbname: str, *, runs: int, workers: int, concurrency: int) -> tuple[float, float]:
    """Seconds for ``workers`` processes of ``concurrency`` threads to complete ``runs`` I/O-bound runs, and the
    working span within them on the database's clock (first step started to last step finished)."""
    app.reset()
    records.create_pending(runs, workflow=io5.name)
    seconds = app.run_workers(dbname, workers, *worker_args(concurrency)).seconds
    counts = app.status_counts()
    [(attempts, completed, span)] = app.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'completed'), "
        "extract(epoch FROM max(finished_at) - min(started_at)) FROM run_step")
    if counts != {"completed": runs} or attempts != completed or completed != runs * IO_STEPS:
        raise RuntimeError(f"{workers} worker(s) left the runs as {counts} with {completed}/{attempts} completed "
                           f"attempts, expected {runs} completed runs and {runs * IO_STEPS} attempts")
    return seconds, float(span)


def measure(*, dbs: Databases, runs: int, workers: int, concurrency: int, repeat: int) -> dict[str, Any]:
    """Figure 9: wall time of durableruns (``workers`` x ``concurrency``) and of DBOS, and the critical path."""
    rounds = ("durableruns", "dbos", "startup")
    seconds: dict[str, list[float]] = {name: [] for name in rounds}
    spans: list[float] = []
    dbos_threads: set[Any] = set()
    for _, name in rotation(rounds, repeat):
        if name == "dbos":
            result = dbos_baseline.measure_io(workflows_count=runs, dbname=dbs.dbos_io)
            seconds[name].append(result["total_s"])
            threads = result.get("executor_threads")
            dbos_threads.add("unbounded (sys.maxsize)" if threads and threads >= 2**62 else str(threads))
        elif name == "startup":
            seconds[name].append(app.startup_seconds(dbs.app))
        else:
            wall, span = one_round(dbs.app, runs=runs, workers=workers, concurrency=concurrency)
            seconds[name].append(wall)
            spans.append(span)
    app.reset()
    startup = seconds.pop("startup")
    seconds["durableruns_net_of_startup"] = [s - up for s, up in zip(seconds["durableruns"], startup)]
    seconds["durableruns_working_span"] = spans
    summaries = {name: summarize(samples) for name, samples in seconds.items()}
    steps = runs * IO_STEPS
    figures: dict[str, Any] = {
        name: {"seconds": summary, "steps_per_s": summarize([steps / s for s in seconds[name]])}
        for name, summary in summaries.items()
    }
    figures["process_startup_s"] = summarize(startup)
    figures["critical_path_s"] = CRITICAL_PATH_S
    figures["durableruns_over_dbos"] = ratio(summaries["durableruns"], summaries["dbos"])
    figures["durableruns_net_over_dbos"] = ratio(summaries["durableruns_net_of_startup"], summaries["dbos"])
    figures["durableruns_over_critical_path"] = summaries["durableruns"]["median"] / CRITICAL_PATH_S
    figures["dbos_over_critical_path"] = summaries["dbos"]["median"] / CRITICAL_PATH_S
    figures["params"] = {
        "runs": runs, "steps_per_run": IO_STEPS, "step_sleep_ms": 1000 * IO_STEP_SECONDS, "rounds": repeat,
        "workers": workers, "concurrency": concurrency,
        "worker_args": " ".join(worker_args(concurrency)),
        "dbos_executor_threads": sorted(dbos_threads),
        "durableruns_timing": f"wall time from starting {workers} resume_runs processes until the last exited "
                              "(all completed), interpreter and Django start-up included; net_of_startup "
                              "subtracts the same round's empty resume_runs process; working_span is the "
                              "first step's start to the last step's end on the database's clock",
        "dbos_timing": "one fresh process per round: DBOS launched (untimed), then from the first "
                       "DBOS.start_workflow of all the workflows until every handle's get_result() returned",
    }
    return figures
