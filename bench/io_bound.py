"""I/O-bound throughput against DBOS: many runs whose steps wait on far calls, worked concurrently.

The work is ``runs`` runs of bench.workflows.io5 (5 steps, each a 20 ms time.sleep standing for a far call),
measured two ways by durableruns, in rounds alternating with DBOS's (checked each time: every run completed,
every step run once):

- like for like (`--loop`, what the target judges): ``workers`` `manage.py resume_runs --loop --concurrency N`
  processes are started and left to go idle, untimed, as DBOS's launch is; they work WARM_UP_BATCHES batches of
  the same runs first (the first recorded apart as first_batch: each new connection prepares and plans the
  engine's statements on its first uses, which a worker that has been running paid long before); then this
  process starts the runs
  with durableruns.start(), one after another, and the figure runs from the first start to the last run's
  completion, both on the database's clock: clock_timestamp() read just before the first start(), to the
  largest updated_at of the completed runs (the now() of the statement that completed the last one, which
  records its last step's result too). The workers are stopped by SIGTERM afterwards and must exit 0.
- cron-shaped (`--once`): the pending runs are recorded in bulk, then ``workers`` `resume_runs --once` processes
  are started at once, timed from starting them until the last exits (each does when nothing is due any more):
  process start-up is included, and measured apart in the same round (an empty resume_runs process).

DBOS Transact gets the same work in one fresh process: the same number of 5-step workflows sleeping 20 ms a
step, all started at once with DBOS.start_workflow on its default executor, timed from the first start until
every handle's result is in (DBOS launched first, untimed). The critical path, one run alone with nothing else
to do, is 5 x 20 ms.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import durableruns
from bench import app, dbos_baseline, records
from bench.commit_limit import proc_cpu_s
from bench.pg import Databases
from bench.stats import ratio, rotation, summarize
from bench.workflows import IO_STEP_SECONDS, IO_STEPS, io5

CRITICAL_PATH_S = IO_STEPS * IO_STEP_SECONDS
# Batches the fresh --loop workers work before the timed one. PostgreSQL plans a prepared statement afresh for
# its first five executions on each connection before it settles on the generic plan; with 64 connections
# sharing 200 runs, a thread's connection has claimed only about three times after one batch.
WARM_UP_BATCHES = 3


def worker_args(concurrency: int) -> tuple[str, ...]:
    return ("--once", "--concurrency", str(concurrency), "--lease", "30")


def loop_args(concurrency: int) -> tuple[str, ...]:
    return ("--loop", "--concurrency", str(concurrency), "--lease", "30")


def check_all_done(runs: int, workers: int) -> float:
    """Raise unless every run completed with each of its steps run once; return the working span on the
    database's clock (first step started to last step finished)."""
    counts = app.status_counts()
    [(attempts, completed, span)] = app.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'completed'), "
        "extract(epoch FROM max(finished_at) - min(started_at)) FROM run_step")
    if counts != {"completed": runs} or attempts != completed or completed != runs * IO_STEPS:
        raise RuntimeError(f"{workers} worker(s) left the runs as {counts} with {completed}/{attempts} completed "
                           f"attempts, expected {runs} completed runs and {runs * IO_STEPS} attempts")
    return float(span)


def one_round(dbname: str, *, runs: int, workers: int, concurrency: int) -> tuple[float, float]:
    """Seconds for ``workers`` --once processes of ``concurrency`` threads to complete ``runs`` I/O-bound runs
    recorded beforehand, and the working span within them on the database's clock."""
    app.reset()
    records.create_pending(runs, workflow=io5.name)
    seconds = app.run_workers(dbname, workers, *worker_args(concurrency)).seconds
    return seconds, check_all_done(runs, workers)


def wait_idle(*, backends: int, timeout: float = 60.0) -> None:
    """Wait until the bench database has at least ``backends`` other client connections, none of them busy, for
    three looks in a row 0.1 s apart: the --loop workers' threads have made their first (empty) claim and wait."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 3:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the --loop workers did not go idle within {timeout:g} s")
        [(connected, busy)] = app.execute(
            "SELECT count(*), count(*) FILTER (WHERE state <> 'idle') FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        quiet = quiet + 1 if connected >= backends and busy == 0 else 0
        time.sleep(0.1)


def loop_round(dbname: str, *, runs: int, workers: int,
               concurrency: int) -> tuple[float, float, float, float, dict[str, float]]:
    """Seconds, on the database's clock, from the first durableruns.start() of ``runs`` I/O-bound runs until the
    last completed, worked by ``workers`` --loop processes of ``concurrency`` threads started (untimed) before;
    the same span as this process saw it, polling every 20 ms (an upper bound, for the record); the first
    batch's seconds; the claims that found nothing per run, over every batch (from the workers' summaries); and
    where the timed batch's time went (`Spent`)."""
    app.reset()
    started = []
    try:
        for _ in range(workers):
            started.append(app.LoopWorker(dbname, *loop_args(concurrency)))
        for worker in started:
            line = worker.first_line()
            if "listening on" not in line:
                raise RuntimeError(f"a --loop worker is not listening: {line}")
        # The first batch, fresh workers' first work: each thread's connection prepares and plans the engine's
        # statements on first use. A worker that has been running has paid that long before, so this batch is
        # recorded apart (first_batch) and the figure is the next one, on workers that have worked.
        wait_idle(backends=workers * concurrency)
        first, _ = _start_and_wait(runs, workers, prefix="first")
        for batch in range(1, WARM_UP_BATCHES):
            app.clear()  # not TRUNCATE, which would make every worker's connection plan its statements anew
            wait_idle(backends=workers * concurrency)
            _start_and_wait(runs, workers, prefix=f"warm{batch}")
        app.clear()
        wait_idle(backends=workers * concurrency)
        with Spent([worker.proc.pid for worker in started]) as spent:
            seconds, polled = _start_and_wait(runs, workers, prefix="io", spent=spent)
    finally:
        app.stop_all(started)
    empty = sum(found_nothing(worker.lines) for worker in started)
    return seconds, polled, first, empty / (runs * (WARM_UP_BATCHES + 1)), spent.figures(runs * IO_STEPS)


class Spent:
    """Where a timed batch's time went: the CPU seconds of the worker processes, of PostgreSQL (this database's
    backends and the server's own processes: WAL writer, checkpointer, ...) and of this process, read from
    /proc before and after; and how long this process took to start the runs, one after another."""

    def __init__(self, worker_pids: list[int]) -> None:
        self.worker_pids = worker_pids
        self.starting_s = 0.0

    @staticmethod
    def _server_cpu() -> dict[int, float]:
        pids = app.execute("SELECT pid FROM pg_stat_activity "
                           "WHERE datname = current_database() OR backend_type <> 'client backend'")
        return {pid: proc_cpu_s(pid) or 0.0 for (pid,) in pids}

    @staticmethod
    def _own_cpu() -> float:
        times = os.times()
        return times.user + times.system

    def __enter__(self) -> Spent:
        self._workers = [proc_cpu_s(pid) or 0.0 for pid in self.worker_pids]
        self._server = self._server_cpu()
        self._own = self._own_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.workers_cpu_s = sum((proc_cpu_s(pid) or 0.0) - before
                                 for pid, before in zip(self.worker_pids, self._workers))
        self.server_cpu_s = sum(cpu - self._server.get(pid, 0.0) for pid, cpu in self._server_cpu().items())
        self.starter_cpu_s = self._own_cpu() - self._own

    def figures(self, steps: int) -> dict[str, float]:
        total = self.workers_cpu_s + self.server_cpu_s + self.starter_cpu_s
        return {"starting_s": self.starting_s, "workers_cpu_ms_per_step": 1e3 * self.workers_cpu_s / steps,
                "server_cpu_ms_per_step": 1e3 * self.server_cpu_s / steps,
                "starter_cpu_ms_per_step": 1e3 * self.starter_cpu_s / steps,
                "cpu_s": total, "cpu_floor_s": total / (os.cpu_count() or 1)}


def found_nothing(lines: list[str]) -> int:
    """The claims that found nothing, as a resume_runs process's summary line says at its exit."""
    for line in reversed(lines):
        said = re.search(r"(\d+) claim\(s\), (\d+) found nothing", line)
        if said:
            return int(said.group(2))
    raise RuntimeError(f"no summary line from a --loop worker: {lines[-3:]}")


def _start_and_wait(runs: int, workers: int, *, prefix: str, spent: Spent | None = None) -> tuple[float, float]:
    """Start ``runs`` runs one after another and wait until all are completed (checked: each step once); return
    the span on the database's clock and as this process saw it, polling every 20 ms. `spent` hears how long the
    starts took."""
    [(began,)] = app.execute("SELECT clock_timestamp()")
    began_here = time.perf_counter()
    for index in range(runs):
        durableruns.start(io5.name, {}, run_id=f"{prefix}-{index:05d}")
    if spent is not None:
        spent.starting_s = time.perf_counter() - began_here
    deadline = time.monotonic() + 600
    while app.status_counts().get("completed", 0) < runs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the --loop workers left the runs as {app.status_counts()} after 600 s")
        time.sleep(0.02)
    polled = time.perf_counter() - began_here
    check_all_done(runs, workers)
    [(ended,)] = app.execute("SELECT max(updated_at) FROM run_state WHERE status = 'completed'")
    return (ended - began).total_seconds(), polled


def measure(*, dbs: Databases, runs: int, workers: int, concurrency: int, repeat: int) -> dict[str, Any]:
    """Figure 9: wall time of durableruns (``workers`` x ``concurrency``, --loop and --once) and of DBOS, and the
    critical path."""
    rounds = ("durableruns_loop", "durableruns", "dbos", "startup")
    seconds: dict[str, list[float]] = {name: [] for name in rounds}
    spans: list[float] = []
    polled: list[float] = []
    first_batch: list[float] = []
    empty_claims: list[float] = []  # per run, in the --loop rounds
    spending: list[dict[str, float]] = []  # where the --loop rounds' time went (Spent)
    dbos_threads: set[Any] = set()
    for _, name in rotation(rounds, repeat):
        if name == "dbos":
            result = dbos_baseline.measure_io(workflows_count=runs, dbname=dbs.dbos_io)
            seconds[name].append(result["total_s"])
            threads = result.get("executor_threads")
            dbos_threads.add("unbounded (sys.maxsize)" if threads and threads >= 2**62 else str(threads))
        elif name == "startup":
            seconds[name].append(app.startup_seconds(dbs.app))
        elif name == "durableruns_loop":
            wall, seen, first, empty, spent = loop_round(dbs.app, runs=runs, workers=workers,
                                                         concurrency=concurrency)
            seconds[name].append(wall)
            spending.append(spent)
            polled.append(seen)
            first_batch.append(first)
            empty_claims.append(empty)
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
    figures["durableruns_loop_polled_s"] = summarize(polled)
    figures["durableruns_loop_first_batch_s"] = summarize(first_batch)
    figures["durableruns_loop_empty_claims_per_run"] = summarize(empty_claims)
    if spending:
        figures["durableruns_loop_spent"] = {key: summarize([spent[key] for spent in spending])
                                             for key in spending[0]}
    figures["durableruns_loop_first_batch_over_dbos"] = ratio(summarize(first_batch), summaries["dbos"])
    figures["critical_path_s"] = CRITICAL_PATH_S
    # The ideal schedule: every far call back to back on every thread of every worker, and never less than one
    # run's own calls one after another.
    ideal = max(CRITICAL_PATH_S, steps * IO_STEP_SECONDS / (workers * concurrency))
    figures["ideal_schedule_s"] = ideal
    figures["durableruns_loop_over_ideal"] = summarize([s / ideal for s in seconds["durableruns_loop"]])
    figures["durableruns_loop_over_dbos"] = ratio(summaries["durableruns_loop"], summaries["dbos"])
    figures["durableruns_over_dbos"] = ratio(summaries["durableruns"], summaries["dbos"])
    figures["durableruns_net_over_dbos"] = ratio(summaries["durableruns_net_of_startup"], summaries["dbos"])
    figures["durableruns_loop_over_critical_path"] = summaries["durableruns_loop"]["median"] / CRITICAL_PATH_S
    figures["durableruns_over_critical_path"] = summaries["durableruns"]["median"] / CRITICAL_PATH_S
    figures["dbos_over_critical_path"] = summaries["dbos"]["median"] / CRITICAL_PATH_S
    figures["params"] = {
        "runs": runs, "steps_per_run": IO_STEPS, "step_sleep_ms": 1000 * IO_STEP_SECONDS, "rounds": repeat,
        "workers": workers, "concurrency": concurrency,
        "worker_args": " ".join(worker_args(concurrency)),
        "loop_worker_args": " ".join(loop_args(concurrency)),
        "dbos_executor_threads": sorted(dbos_threads),
        "durableruns_loop_timing": f"{workers} resume_runs {' '.join(loop_args(concurrency))} processes started "
                                   f"and idle beforehand (untimed, as DBOS's launch is), that have worked "
                                   f"{WARM_UP_BATCHES} batches of {runs} runs first (the first recorded apart as "
                                   "first_batch: each new connection "
                                   "prepares and plans the engine's statements on first use, which a running "
                                   f"worker paid long before); then this process called durableruns.start() {runs} "
                                   "times, one after another; from clock_timestamp() "
                                   "read just before the first start() to the largest updated_at of the completed "
                                   "runs (the now() of the statement that completed the last one), both on the "
                                   "database's clock; polled_s is the same span on this process's clock, ended by "
                                   "a poll every 20 ms that saw every run completed (an upper bound)",
        "durableruns_timing": f"wall time from starting {workers} resume_runs processes until the last exited "
                              "(all completed), interpreter and Django start-up included; net_of_startup "
                              "subtracts the same round's empty resume_runs process; working_span is the "
                              "first step's start to the last step's end on the database's clock",
        "dbos_timing": "one fresh process per round: DBOS launched (untimed), then from the first "
                       "DBOS.start_workflow of all the workflows until every handle's get_result() returned",
    }
    return figures
