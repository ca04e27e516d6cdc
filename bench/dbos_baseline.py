"""DBOS Transact 3.4 on the same PostgreSQL, as the reference durable-execution library.

It measures (a) the per-step cost of a 9-step workflow of no-op ``@DBOS.step()``
steps run sequentially, (b) how long DBOS takes to recover and finish
workflows left PENDING by a SIGKILLed process, and (c) how long one process
takes to finish many I/O-bound workflows started at once (5 steps that each
sleep 20 ms), so durable runs can be compared with an established design on
identical hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import psycopg

from bench.pg import Databases, conninfo, database_url, recreate_database
from bench.stats import Workload, measure, rounded

if TYPE_CHECKING:
    from dbos import DBOSConfig

APP_NAME = "durableruns-bench"
# Fixed so the recovering process (whose step 5 no longer blocks) has the same
# version as the crashed one; DBOS otherwise hashes the workflow source code,
# and launch only recovers PENDING workflows of its own version and executor id.
APP_VERSION = "bench-1"
EXECUTOR_ID = "local"

STEPS_DB = Databases().dbos_steps
RECOVERY_DB = Databases().dbos_recovery

STEPS_PER_WORKFLOW = 9
BLOCK_AFTER = 4  # the recovery workflows block in step 5, after 4 recorded steps
WORKFLOW_NAME = "bench_wf9"
STEP_NAMES = [f"bench_step_{i}" for i in range(1, STEPS_PER_WORKFLOW + 1)]

RESULT_MARKER = "DBOS_BENCH_RESULT "
REPO_ROOT = Path(__file__).resolve().parent.parent


def dbos_config(dbname: str) -> DBOSConfig:
    """The DBOSConfig used by every process (DBOS 3.x has only a system database)."""
    return {
        "name": APP_NAME,
        "system_database_url": database_url(dbname),
        "application_version": APP_VERSION,
        "executor_id": EXECUTOR_ID,
        "log_level": "WARNING",
    }


# --- workflow definitions (registered lazily, once per process) ----------------


class _Workflows:
    """The DBOS-registered 9-step workflow and the hooks the recovery benchmark needs."""

    def __init__(self) -> None:
        from dbos import DBOS

        self.block_step5: Optional[threading.Event] = None
        self.executed = 0
        self.first_executed_at: Optional[float] = None  # perf_counter of the first step body run
        self._lock = threading.Lock()

        def make_step(index: int) -> Callable[[], None]:
            def body() -> None:
                if index == BLOCK_AFTER + 1 and self.block_step5 is not None:
                    self.block_step5.wait()
                with self._lock:
                    if self.first_executed_at is None:
                        self.first_executed_at = time.perf_counter()
                    self.executed += 1

            body.__name__ = STEP_NAMES[index - 1]
            body.__qualname__ = STEP_NAMES[index - 1]
            return DBOS.step(name=STEP_NAMES[index - 1])(body)

        steps = [make_step(i) for i in range(1, STEPS_PER_WORKFLOW + 1)]

        def workflow() -> None:
            for step in steps:
                step()

        workflow.__name__ = WORKFLOW_NAME
        workflow.__qualname__ = WORKFLOW_NAME
        self.workflow: Callable[[], None] = DBOS.workflow(name=WORKFLOW_NAME)(workflow)


_workflows: Optional[_Workflows] = None

IO_WORKFLOW_NAME = "bench_io5"
IO_STEPS = 5
IO_STEP_SECONDS = 0.02  # the same far call as bench.workflows.io5's steps
IO_STEP_NAMES = [f"bench_io_call_{i}" for i in range(1, IO_STEPS + 1)]
_io_workflow: Optional[Callable[[], None]] = None


def io_workflow() -> Callable[[], None]:
    """The DBOS-registered 5-step workflow whose steps each wait 20 ms (time.sleep), registered once."""
    global _io_workflow
    if _io_workflow is None:
        from dbos import DBOS

        def make_step(name: str) -> Callable[[], None]:
            def body() -> None:
                time.sleep(IO_STEP_SECONDS)

            body.__name__ = body.__qualname__ = name
            return DBOS.step(name=name)(body)

        steps = [make_step(name) for name in IO_STEP_NAMES]

        def workflow() -> None:
            for step in steps:
                step()

        workflow.__name__ = workflow.__qualname__ = IO_WORKFLOW_NAME
        _io_workflow = DBOS.workflow(name=IO_WORKFLOW_NAME)(workflow)
    return _io_workflow


def workflows() -> _Workflows:
    global _workflows
    if _workflows is None:
        _workflows = _Workflows()
    return _workflows


def launch(dbname: str) -> None:
    """Register the workflow, construct DBOS for ``dbname`` and launch it."""
    from dbos import DBOS

    workflows()
    DBOS(config=dbos_config(dbname))
    DBOS.launch()


def destroy() -> None:
    from dbos import DBOS

    DBOS.destroy(destroy_registry=False)


# --- (a) per-step latency ------------------------------------------------------


@contextmanager
def steps_session(dbname: str = STEPS_DB) -> Iterator[Callable[..., Workload]]:
    """DBOS launched in this process on a freshly recreated ``dbname``; yields a factory of workloads.

    ``factory(n)`` is a workload running ``n`` 9-step workflows one after another, with ``ops`` counting
    steps (so its samples are ms per step). DBOS is destroyed on exit.
    """
    recreate_database(dbname)
    launch(dbname)
    try:
        wf = workflows().workflow

        def factory(n: int, name: str = "dbos") -> Workload:
            def work(_prepared: None) -> None:
                for _ in range(n):
                    wf()

            return Workload(name=name, run=work, ops=n * STEPS_PER_WORKFLOW)

        yield factory
    finally:
        destroy()


def measure_steps(*, repeat: int = 10, workflows_per_rep: int = 50, warmup: int = 1,
                  dbname: str = STEPS_DB) -> dict[str, Any]:
    """ms per step (workflow wall time / 9) and ms per workflow, workflows run one after another.

    Launches DBOS in this process on a freshly recreated system database and
    destroys it before returning.
    """
    with steps_session(dbname) as factory:
        w = factory(workflows_per_rep)
        per_step = measure(w.run, repeat=repeat, warmup=warmup, ops=w.ops, setup=w.setup)
    per_workflow = {k: (v * STEPS_PER_WORKFLOW if k != "n" else v) for k, v in per_step.items()}
    return {
        "ms_per_step": per_step,
        "ms_per_workflow": per_workflow,
        "params": {
            "repeat": repeat,
            "workflows_per_rep": workflows_per_rep,
            "steps_per_workflow": STEPS_PER_WORKFLOW,
        },
    }


# --- (b) recovery --------------------------------------------------------------


def _count_after_step(conn: psycopg.Connection[Any], step_name: str) -> int:
    """Workflows whose step ``step_name`` is recorded in DBOS's operation_outputs."""
    row = conn.execute(
        "SELECT count(DISTINCT workflow_uuid) FROM dbos.operation_outputs WHERE function_name = %s",
        (step_name,),
    ).fetchone()
    return int(row[0]) if row is not None else 0


def _count_status(conn: psycopg.Connection[Any], status: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM dbos.workflow_status WHERE name = %s AND status = %s",
        (WORKFLOW_NAME, status),
    ).fetchone()
    return int(row[0]) if row is not None else 0


def _child_command(phase: str, n: int, dbname: str) -> list[str]:
    code = "import sys; from bench.dbos_baseline import child_main; child_main(sys.argv[1:])"
    return [sys.executable, "-c", code, phase, str(n), dbname]


def _crash_phase(n: int, dbname: str) -> None:
    """Child process: start ``n`` workflows that block in step 5, then wait to be killed."""
    from dbos import DBOS

    wfs = workflows()
    wfs.block_step5 = threading.Event()  # never set: step 5 blocks until SIGKILL
    launch(dbname)
    for _ in range(n):
        DBOS.start_workflow(wfs.workflow)
    threading.Event().wait()


def _recover_phase(n: int, dbname: str, timeout: float) -> None:
    """Child process: launch DBOS (which recovers the PENDING workflows) and time until all succeed."""
    workflows()  # import dbos and register the workflow before the clock starts
    t0 = time.perf_counter()
    launch(dbname)
    t_launched = time.perf_counter()
    done = 0
    deadline = t0 + timeout
    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        while True:
            done = _count_status(conn, "SUCCESS")
            if done >= n or time.perf_counter() > deadline:
                break
            time.sleep(0.02)
    t_done = time.perf_counter()
    first = workflows().first_executed_at
    result = {
        "completed": done,
        "launch_s": t_launched - t0,
        "first_step_s": (first - t0) if first is not None else None,
        "total_s": t_done - t0,
        "steps_executed": workflows().executed,
    }
    print(RESULT_MARKER + json.dumps(result), flush=True)
    destroy()


def _io_phase(n: int, dbname: str) -> None:
    """Child process: launch DBOS, start ``n`` I/O-bound workflows at once on its default executor, wait for all."""
    from dbos import DBOS

    wf = io_workflow()
    workflows()
    launch(dbname)
    t0 = time.perf_counter()
    handles = [DBOS.start_workflow(wf) for _ in range(n)]
    t_started = time.perf_counter()
    for handle in handles:
        handle.get_result()
    t_done = time.perf_counter()
    from dbos._dbos import _get_dbos_instance

    executor = _get_dbos_instance()._executor
    result = {"total_s": t_done - t0, "start_calls_s": t_started - t0,
              "executor_threads": getattr(executor, "_max_workers", None)}
    print(RESULT_MARKER + json.dumps(result), flush=True)
    destroy()


def child_main(argv: list[str]) -> None:
    """Entry point of the DBOS child processes: ``crash N DB``, ``recover N DB [TIMEOUT]`` or ``io N DB``."""
    phase, n, dbname = argv[0], int(argv[1]), argv[2]
    if phase == "crash":
        _crash_phase(n, dbname)
    elif phase == "recover":
        _recover_phase(n, dbname, timeout=float(argv[3]) if len(argv) > 3 else 600.0)
    elif phase == "io":
        _io_phase(n, dbname)
    else:
        raise SystemExit(f"unknown phase {phase!r}")


def measure_recovery(*, workflows_count: int = 1000, timeout: float = 600.0, dbname: str = RECOVERY_DB
                     ) -> dict[str, Any]:
    """Seconds for a fresh DBOS process to recover and finish ``workflows_count`` workflows.

    A child process starts the workflows; each blocks in step 5 after 4 recorded
    steps. Once all have recorded step 4 the child is SIGKILLed; a second child
    launches DBOS with the same executor id and application version, and the
    time from constructing DBOS until every workflow is SUCCESS is reported
    (``launch_s``: until ``DBOS.launch()`` returned; ``first_step_s``: until the
    first recovered step body ran, which includes DBOS's internal-queue poll).
    ``recovered_steps_per_s`` counts the 5 remaining steps (5..9) per workflow.
    """
    n = workflows_count
    recreate_database(dbname)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")

    t_crash0 = time.perf_counter()
    crash = subprocess.Popen(_child_command("crash", n, dbname), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        # The system schema only exists once the child has launched DBOS.
        reached = 0
        deadline = time.perf_counter() + timeout
        while reached < n:
            if crash.poll() is not None:
                raise RuntimeError(f"crash child exited early with code {crash.returncode}")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"only {reached}/{n} workflows reached step {BLOCK_AFTER}")
            try:
                with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
                    reached = _count_after_step(conn, STEP_NAMES[BLOCK_AFTER - 1])
            except psycopg.errors.UndefinedTable:
                reached = 0
            time.sleep(0.1)
        t_blocked = time.perf_counter()
    finally:
        crash.send_signal(signal.SIGKILL)
        crash.wait()

    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        pending = _count_status(conn, "PENDING")
        beyond = _count_after_step(conn, STEP_NAMES[BLOCK_AFTER])
    if pending != n or beyond != 0:
        raise RuntimeError(f"after SIGKILL: {pending} PENDING (want {n}), {beyond} past step {BLOCK_AFTER} (want 0)")

    recover = subprocess.run(
        _child_command("recover", n, dbname) + [str(timeout)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        check=True,
        text=True,
        timeout=timeout + 60,
    )
    lines = [line for line in recover.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if not lines:
        raise RuntimeError(f"recovering process printed no result: {recover.stdout!r}")
    child = json.loads(lines[-1][len(RESULT_MARKER):])

    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        succeeded = _count_status(conn, "SUCCESS")
        step9 = _count_after_step(conn, STEP_NAMES[-1])
    if succeeded != n or step9 != n:
        raise RuntimeError(f"recovery finished {succeeded}/{n} workflows ({step9} recorded step 9)")
    remaining = STEPS_PER_WORKFLOW - BLOCK_AFTER
    if child["steps_executed"] != n * remaining:
        raise RuntimeError(
            f"recovering process executed {child['steps_executed']} step bodies, expected {n * remaining}"
        )
    return {
        "workflows": n,
        "recovery_s": child["total_s"],
        "launch_s": child["launch_s"],
        "first_step_s": child["first_step_s"],
        "recovered_steps": n * remaining,
        "recovered_steps_per_s": n * remaining / child["total_s"],
        "workflows_per_s": n / child["total_s"],
        "crash_phase_s": t_blocked - t_crash0,
        "params": {"workflows": n, "steps_per_workflow": STEPS_PER_WORKFLOW, "blocked_after_step": BLOCK_AFTER},
    }


def measure_io(*, workflows_count: int, dbname: str, timeout: float = 600.0) -> dict[str, Any]:
    """Seconds for one fresh DBOS process to finish ``workflows_count`` I/O-bound workflows started at once.

    The system database is recreated first; the child launches DBOS (untimed), then times from its first
    ``DBOS.start_workflow`` until every handle's ``get_result()`` has returned. Checked afterwards: every
    workflow SUCCESS with its five steps recorded.
    """
    recreate_database(dbname)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.run(_child_command("io", workflows_count, dbname), cwd=REPO_ROOT, env=env,
                           stdout=subprocess.PIPE, check=True, text=True, timeout=timeout)
    lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if not lines:
        raise RuntimeError(f"the DBOS process printed no result: {child.stdout!r}")
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT_MARKER):])
    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM dbos.workflow_status WHERE name = %s AND status = 'SUCCESS'",
                           (IO_WORKFLOW_NAME,)).fetchone()
        succeeded = int(row[0]) if row is not None else 0
        last = _count_after_step(conn, IO_STEP_NAMES[-1])
    if succeeded != workflows_count or last != workflows_count:
        raise RuntimeError(f"DBOS finished {succeeded}/{workflows_count} workflows ({last} recorded the last step)")
    return result


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workflows-per-rep", type=int, default=50)
    parser.add_argument("--recovery-workflows", type=int, default=20, help="0 skips the recovery benchmark")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"steps": measure_steps(repeat=args.repeat, workflows_per_rep=args.workflows_per_rep)}
    if args.recovery_workflows > 0:
        result["recovery"] = measure_recovery(workflows_count=args.recovery_workflows)
    print(json.dumps(rounded(result), indent=2))


if __name__ == "__main__":
    main()
