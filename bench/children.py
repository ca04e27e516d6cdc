"""100 child runs started and joined, against DBOS Transact's child workflows on the same PostgreSQL, side by side.

durableruns: a `bench_parent` run's first step starts 100 `bench_child` runs (one no-op step each) with
ctx.start_run, its join waits (holding no worker) until they ended, and a last step counts them. The runs are
worked by one `resume_runs --loop --concurrency T` process started before the rounds (its idle threads woken by
NOTIFY). Timed, in this process: from services.start_run of the parent until the record says it completed.

DBOS 3.4: a parent workflow calls DBOS.start_workflow 100 times for a child workflow of one no-op step, then
get_result() on each handle. Timed in a process of its own (DBOS launched untimed, one parent run as a warm-up):
from DBOS.start_workflow of the parent until its get_result() returned. DBOS runs the workflows on its default
executor's threads.

Rounds alternate (durableruns, DBOS, durableruns, ...), each on the same PostgreSQL, so load drifts alike. The
target (issue 23): durableruns' wall time at most 0.5 x DBOS's.

    python -m bench.children --db-prefix dr_children_bench --rounds 5 --out bench/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import report
from bench.pg import conninfo, database_url, recreate_database, server_settings
from bench.stats import ratio, rounded, summarize

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULT_MARKER = "DBOS_CHILDREN_RESULT "
TARGET = 0.5


# -- durableruns ---------------------------------------------------------------------------------------------------


def durableruns_round(*, children: int) -> float:
    """Seconds from starting the parent until it completed, the runs worked by the --loop worker already
    running (its idle threads woken by NOTIFY, as in production); this process polls the parent's status."""
    from bench import workflows
    from durableruns import services
    from durableruns.models import RunState, RunStatus

    began = time.perf_counter()
    run_id = services.start_run(workflows.parent_fan.name, {"children": children})
    deadline = began + 300
    while True:
        status = RunState.objects.values_list("status", flat=True).get(pk=run_id)
        if status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING):
            break
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the parent is still {status} after 300 s")
        time.sleep(0.002)
    seconds = time.perf_counter() - began
    counted = (RunState.objects.get(pk=run_id).attempts.filter(step="count_children", status="completed")
               .values_list("result", flat=True).first())
    if status != RunStatus.COMPLETED or counted != {"completed": children}:
        raise RuntimeError(f"the parent ended {status} with {counted}")
    return seconds


# -- DBOS ----------------------------------------------------------------------------------------------------------


def _dbos_process(children: int, dbname: str) -> None:
    """In a process of its own: launch DBOS on `dbname`, run one parent as a warm-up, then time one."""
    from dbos import DBOS

    @DBOS.step(name="bench_child_step")
    def child_step(n: int) -> int:
        return n

    @DBOS.workflow(name="bench_child_wf")
    def child(n: int) -> int:
        return child_step(n)

    @DBOS.workflow(name="bench_parent_wf")
    def parent(count: int) -> int:
        handles = [DBOS.start_workflow(child, n) for n in range(count)]
        return sum(1 for handle in handles if handle.get_result() is not None)

    DBOS(config={"name": "durableruns-bench-children", "system_database_url": database_url(dbname),
                 "application_version": "bench-children-1", "executor_id": "local", "log_level": "WARNING"})
    DBOS.launch()
    try:
        if DBOS.start_workflow(parent, children).get_result() != children:  # warm-up
            raise RuntimeError("the warm-up parent did not see every child")
        began = time.perf_counter()
        done = DBOS.start_workflow(parent, children).get_result()
        seconds = time.perf_counter() - began
        if done != children:
            raise RuntimeError(f"the parent saw {done} of {children} children")
        from dbos._dbos import _get_dbos_instance

        executor = _get_dbos_instance()._executor
        threads = getattr(executor, "_max_workers", None)
        print(RESULT_MARKER + json.dumps({"seconds": seconds,  # sys.maxsize: DBOS 3.4's executor is unbounded
                                          "executor_threads": "unbounded" if threads == sys.maxsize else threads}),
              flush=True)
    finally:
        DBOS.destroy(destroy_registry=True)


def dbos_round(*, children: int, dbname: str) -> dict[str, Any]:
    """One DBOS process on a fresh system database: its timed parent's seconds and executor threads."""
    recreate_database(dbname)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    code = "import sys; from bench.children import _dbos_process; _dbos_process(int(sys.argv[1]), sys.argv[2])"
    done = subprocess.run([sys.executable, "-c", code, str(children), dbname], cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, check=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if not lines:
        raise RuntimeError(f"the DBOS process printed no result: {done.stdout!r}")
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT_MARKER):])
    return result


# -- the figure ----------------------------------------------------------------------------------------------------


def measure(*, children: int, concurrency: int, rounds: int, app_db: str, dbos_db: str) -> dict[str, Any]:
    """durableruns' and DBOS's wall time for `children` children started and joined, in alternating rounds."""
    from bench import app

    app.reset()
    worker = app.LoopWorker(app_db, "--loop", "--concurrency", str(concurrency), "--lease", "30")
    pickup = worker.first_line()
    ours: list[float] = []
    theirs: list[float] = []
    threads = None
    try:
        durableruns_round(children=children)  # warm-up: the worker's connections, plans recorded
        for _ in range(rounds):
            app.clear()  # row by row: the worker's prepared plans stay valid
            ours.append(durableruns_round(children=children))
            dbos = dbos_round(children=children, dbname=dbos_db)
            theirs.append(dbos["seconds"])
            threads = dbos.get("executor_threads")
    finally:
        worker.stop()
    app.reset()
    ours_s, theirs_s = summarize(ours), summarize(theirs)
    return {
        "durableruns_s": ours_s,
        "dbos_s": theirs_s,
        "durableruns_over_dbos": ratio(ours_s, theirs_s),
        "samples": {"durableruns": ours, "dbos": theirs},
        "params": {"children": children, "durableruns_threads": concurrency, "dbos_executor_threads": threads,
                   "rounds": rounds, "durableruns_worker": pickup.strip(),
                   "durableruns": "services.start_run of the parent until it is completed, worked by one "
                                  "resume_runs --loop process already running: the parent's step asks for the "
                                  "children (ctx.start_run; a re_executable step's children are recorded in its "
                                  "result's commit), its join waits holding nothing, the children run on the "
                                  "worker's threads, the last child's end wakes the join, a last step counts "
                                  "the results; this process polls the parent's status every 2 ms",
                   "dbos": "DBOS.start_workflow of the parent until get_result(): the parent starts the children "
                           "(DBOS.start_workflow each) and waits on each handle's get_result()"},
    }


def write(out: Path, meta: dict[str, Any], figure: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "children.json").write_text(json.dumps(rounded({"meta": meta, "children": figure}), indent=2) + "\n")
    ours, theirs, r = figure["durableruns_s"], figure["dbos_s"], figure["durableruns_over_dbos"]
    p = figure["params"]
    verdict = "PASS" if r["ratio"] <= TARGET else "FAIL"
    lines = [
        "# Child runs: 100 children started and joined, against DBOS",
        "",
        f"Measured {meta['date']} on {meta['nproc']} cores (load average {meta['loadavg_start'][0]:.2f} at the "
        f"start, {meta['loadavg_end'][0]:.2f} at the end), PostgreSQL {meta['postgresql'].get('server_version', '?')}"
        f", Python {meta['python']}, commit {meta['git']}.",
        "",
        f"Reproduce: `{meta['command']}`",
        "",
        "Medians over alternating rounds, p10-p90 in brackets; the ratio's spread compares p10 with p90.",
        "",
        "| target | measured | limit | result |",
        "|---|---:|---:|---:|",
        f"| {p['children']} children started and joined <= {TARGET} x DBOS's wall time | "
        f"{ours['median']:.3f} s against {theirs['median']:.3f} s: {r['ratio']:.2f} "
        f"(spread {r['low']:.2f}-{r['high']:.2f}) | <= {TARGET} | {verdict} |",
        "",
        "| system | wall time, s | threads |",
        "|---|---:|---:|",
        f"| durableruns (ctx.start_run x {p['children']}, join; resume_runs --loop) | {ours['median']:.3f} "
        f"({ours['p10']:.3f}-{ours['p90']:.3f}) | {p['durableruns_threads']} |",
        f"| DBOS 3.4 (DBOS.start_workflow x {p['children']}, get_result) | {theirs['median']:.3f} "
        f"({theirs['p10']:.3f}-{theirs['p90']:.3f}) | {p['dbos_executor_threads']} |",
        "",
        f"- durableruns: {p['durableruns']}.",
        f"- DBOS: {p['dbos']}.",
        f"- {p['rounds']} round(s) each, alternating, after one warm-up of each.",
    ]
    if meta.get("note"):
        lines += ["", meta["note"]]
    (out / "children.md").write_text("\n".join(lines) + "\n")



def _drop(dbname: str) -> None:
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8, help="durableruns' worker threads")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--db-prefix", default="dr_bench_children")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    app_db, dbos_db = f"{args.db_prefix}_app", f"{args.db_prefix}_dbos"
    from bench import app

    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": report.reproducing_command("bench.children", argv), "nproc": os.cpu_count(),
        "loadavg_start": os.getloadavg(), "python": platform.python_version(), "git": report.git_described(), "note": args.note,
    }
    app.configure(app_db)
    meta["postgresql"] = server_settings()
    try:
        figure = measure(children=args.children, concurrency=args.concurrency, rounds=args.rounds, app_db=app_db,
                         dbos_db=dbos_db)
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            _drop(app_db)
            _drop(dbos_db)
    meta["loadavg_end"] = os.getloadavg()
    write(args.out, meta, figure)
    r = figure["durableruns_over_dbos"]
    print(f"durableruns {figure['durableruns_s']['median']:.3f} s, DBOS {figure['dbos_s']['median']:.3f} s: "
          f"{r['ratio']:.2f} x (target <= {TARGET}); wrote {args.out / 'children.md'}")


if __name__ == "__main__":
    main()
