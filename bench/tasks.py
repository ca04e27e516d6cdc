"""Django's Tasks on durableruns beside the Tasks database backend, on the same PostgreSQL: enqueue-to-start latency
and tasks/s.

Both backends are configured in one site (bench/tasks_settings.py): "default" is durableruns.tasks.DurableRunsBackend,
worked by `resume_runs`; "db" is django-tasks-db's DatabaseBackend (the Tasks database backend, on Django 5.2
through the django-tasks backport), worked by its `db_worker`. The task does nothing (bench/task_jobs.py), so what
is measured is the backend.

- Latency: one idle worker of each kind with its defaults (`resume_runs --loop`, listening for new runs; `db_worker`,
  polling every second), and tasks enqueued one at a time at random gaps (uniform, seeded). A task's latency is its
  start (durableruns: the attempt's started_at, the claim's transaction time on the database's clock; db_worker:
  the result's started_at, the worker host's clock, which is this host's) minus the database's clock_timestamp()
  read right after enqueue returned; and minus the time the enqueue recorded in its own transaction (durableruns:
  the run's created_at; db: the result's enqueued_at), which counts the enqueue's commit too. A worker may claim
  a task before the bench's next statement reads the clock, so the first figure can be below zero.
- Throughput: N tasks enqueued first, then W worker processes started together (`resume_runs --once`, one thread
  each, and with 4 threads; `db_worker --batch`), each draining the backlog and exiting; tasks/s is N over the wall
  time from their start to the last exit (each process's start, about a second of Django's, is in both).

    python -m bench.tasks [--tasks 1000] [--latency-tasks 50] [--workers 2] [--db dr_bench_tasks]
                          [--out bench/results/tasks.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.pg import database_url, ensure_database
from bench.stats import percentile

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "dr_bench_tasks"
SETTINGS = "bench.tasks_settings"


def configure(dbname: str) -> None:
    """Point this process's Django at ``dbname`` with both backends, and migrate it."""
    import django
    from django.core.management import call_command

    ensure_database(dbname)
    os.environ.update(env(dbname))
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def env(dbname: str) -> dict[str, str]:
    return {"DATABASE_URL": database_url(dbname), "DJANGO_SETTINGS_MODULE": SETTINGS, "PYTHONUNBUFFERED": "1"}


def execute(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def reset() -> None:
    execute("TRUNCATE run_intervention, run_escalation, run_step, run_state, django_tasks_database_dbtaskresult CASCADE")


COMMANDS = {
    "durableruns": ["resume_runs", "--skip-checks", "--loop", "--lease", "30"],
    "db_worker": ["db_worker", "--backend", "db", "--queue-name", "*", "--no-reload"],
}
DRAIN = {
    "durableruns (1 thread)": ["resume_runs", "--skip-checks", "--once", "--lease", "30", "--concurrency", "1"],
    "durableruns (4 threads)": ["resume_runs", "--skip-checks", "--once", "--lease", "30", "--concurrency", "4"],
    "db_worker": ["db_worker", "--backend", "db", "--queue-name", "*", "--no-reload", "--batch",
                  "--no-startup-delay"],
}


def _start(dbname: str, command: list[str], **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "manage.py", *command], cwd=ROOT, env=dict(os.environ, **env(dbname)),
                            text=True, **popen)


def _enqueue(backend: str) -> str:
    from bench.task_jobs import noop

    task = noop if backend == "durableruns" else noop.using(backend="db")
    return str(task.enqueue().id)


def _starts(backend: str) -> dict[str, Any]:
    if backend == "durableruns":
        return dict(execute("SELECT run_id, started_at FROM run_step WHERE attempt = 1"))
    return dict(execute("SELECT id::text, started_at FROM django_tasks_database_dbtaskresult WHERE started_at IS NOT NULL"))


def _enqueued_at(backend: str) -> dict[str, Any]:
    """When each task was recorded, inside its enqueue's transaction (durableruns: the database's now(); the db
    backend: the enqueuing host's clock)."""
    if backend == "durableruns":
        return dict(execute("SELECT run_id, created_at FROM run_state"))
    return dict(execute("SELECT id::text, enqueued_at FROM django_tasks_database_dbtaskresult"))


def latency_round(dbname: str, backend: str, *, tasks: int, rng: random.Random, gap_ms: tuple[float, float]
                  ) -> tuple[list[float], list[float]]:
    """Enqueue ``tasks`` tasks one at a time while one idle worker waits; each one's start less the moment its
    enqueue returned, and less the moment its enqueue recorded it, in ms."""
    reset()
    worker = _start(dbname, COMMANDS[backend], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(5.0)  # past its start (Django's, and db_worker's random start-up delay of up to 1 s)
        enqueued: dict[str, Any] = {}
        for _ in range(tasks):
            time.sleep(rng.uniform(*gap_ms) / 1000)
            task_id = _enqueue(backend)
            [(now,)] = execute("SELECT clock_timestamp()")
            enqueued[task_id] = now
        deadline = time.monotonic() + 60
        while len(started := _starts(backend)) < tasks and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    if set(started) != set(enqueued):
        raise RuntimeError(f"{backend}: {len(started)} of {tasks} tasks started in time; {err[-2000:]}")
    recorded = _enqueued_at(backend)
    return ([1000 * (started[task_id] - now).total_seconds() for task_id, now in enqueued.items()],
            [1000 * (started[task_id] - recorded[task_id]).total_seconds() for task_id in enqueued])


def throughput_round(dbname: str, name: str, *, tasks: int, workers: int) -> float:
    """Enqueue ``tasks`` tasks, then drain them with ``workers`` processes started together; tasks/s."""
    from django.db import transaction

    reset()
    backend = "db_worker" if name == "db_worker" else "durableruns"
    with transaction.atomic():
        for _ in range(tasks):
            _enqueue(backend)
    began = time.perf_counter()
    procs = [_start(dbname, DRAIN[name], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(workers)]
    errors = [proc.communicate(timeout=1800)[1] for proc in procs]
    seconds = time.perf_counter() - began
    if any(proc.returncode != 0 for proc in procs):
        raise RuntimeError(f"{name}: a worker failed: {errors}")
    done = len(_starts(backend))
    if done != tasks:
        raise RuntimeError(f"{name}: {done} of {tasks} tasks ran")
    return tasks / seconds


def run(dbname: str, *, tasks: int, latency_tasks: int, workers: int, repeat: int, seed: int = 24
        ) -> dict[str, Any]:
    configure(dbname)
    rng = random.Random(seed)
    latency: dict[str, list[float]] = {backend: [] for backend in COMMANDS}
    since_recorded: dict[str, list[float]] = {backend: [] for backend in COMMANDS}
    rate: dict[str, list[float]] = {name: [] for name in DRAIN}
    for _ in range(repeat):  # the kinds alternate, so a change of load falls on both
        for backend in COMMANDS:
            returned, recorded = latency_round(dbname, backend, tasks=latency_tasks, rng=rng, gap_ms=(20.0, 200.0))
            latency[backend] += returned
            since_recorded[backend] += recorded
        for name in DRAIN:
            rate[name].append(throughput_round(dbname, name, tasks=tasks, workers=workers))
    reset()
    return {
        "parameters": {"tasks": tasks, "latency_tasks": latency_tasks, "workers": workers, "repeat": repeat},
        "latency_ms": {backend: {q: round(percentile(samples, float(q[1:])), 1) for q in ("p50", "p90", "p99")}
                       for backend, samples in latency.items()},
        "latency_since_recorded_ms": {
            backend: {q: round(percentile(samples, float(q[1:])), 1) for q in ("p50", "p90", "p99")}
            for backend, samples in since_recorded.items()},
        "tasks_per_second": {name: {"median": round(sorted(r)[len(r) // 2], 1), "rounds": [round(x, 1) for x in r]}
                             for name, r in rate.items()},
        "loadavg": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000, help="tasks drained per throughput round")
    parser.add_argument("--latency-tasks", type=int, default=50, help="tasks enqueued one at a time per round")
    parser.add_argument("--workers", type=int, default=2, help="worker processes draining the backlog")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each figure")
    parser.add_argument("--db", default=DEFAULT_DB)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    figures = run(args.db, tasks=args.tasks, latency_tasks=args.latency_tasks, workers=args.workers,
                  repeat=args.repeat)
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
