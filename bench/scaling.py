"""Scaling inside one worker process: steps/s at --concurrency 1, 8, 32, 128 on I/O-bound runs, and what stops it.

Each level records a backlog of bench.workflows.io5 runs (5 steps of 20 ms far calls), sized so that it takes a
few seconds, and starts ONE `manage.py resume_runs --once --concurrency N` process. Steps/s is counted over the
working span on the database's clock (first step started to last step finished), so process start-up does not
dilute the short levels; the process's wall time is reported too. While it works, a sampler reads
pg_stat_activity every 50 ms (the process's connections, how many are active, how many wait on a lock, on
what), its peak resident memory is read from /proc/<pid>/status (VmHWM), and the machine's CPU from /proc/stat
before and after. When the process exits, os.wait4 gives its CPU time (user + system), against its wall time.

N threads need N connections plus the heartbeat's. When the largest level does not fit in the shared server's
free connections, every level runs on a private server with the shared one's durability settings
(bench.private_pg), so the levels stay comparable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import app, private_pg
from bench.pg import PORT, Databases, conninfo, connections_in_use, database_url, server_settings
from bench.stats import rotation, summarize
from bench.workflows import IO_STEP_SECONDS, IO_STEPS, io5
from durableruns.registry import get_workflow

SAMPLE_EVERY_S = 0.05
APP_NAME = "bench-scaling-worker"  # the worker's connections say so (PGAPPNAME), so only they are counted
SCALING_DB = "scaling"  # the database's name on a private server (on the shared one: the suite's app database)
HEADROOM = 10  # connections left to others on the shared server


@dataclass
class Activity:
    """What pg_stat_activity showed of the worker's connections, sample by sample."""

    samples: int = 0
    max_connections: int = 0
    active: int = 0  # summed over samples
    lock_waits: int = 0  # summed over samples: backends waiting on a heavyweight lock (wait_event_type 'Lock')
    waits: Counter[str] = field(default_factory=Counter)  # wait events of active backends, summed over samples

    def seen(self, rows: list[tuple[Any, ...]]) -> None:
        self.samples += 1
        self.max_connections = max(self.max_connections, len(rows))
        for state, wait_type, wait_event in rows:
            if wait_type == "Lock":
                self.lock_waits += 1
            if state == "active":
                self.active += 1
                self.waits[f"{wait_type}:{wait_event}" if wait_type else "CPU (no wait event)"] += 1


@contextmanager
def sampling(port: int, dbname: str) -> Iterator[Activity]:
    """Sample the worker's backends (application_name APP_NAME) until the block ends."""
    activity = Activity()
    done = threading.Event()

    def run() -> None:
        with psycopg.connect(conninfo(dbname, port), autocommit=True) as conn:
            while not done.is_set():
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity WHERE datname = %s "
                    "AND application_name = %s", (dbname, APP_NAME)).fetchall()
                activity.seen(rows)
                done.wait(SAMPLE_EVERY_S)

    thread = threading.Thread(target=run, name="bench-activity", daemon=True)
    thread.start()
    try:
        yield activity
    finally:
        done.set()
        thread.join(timeout=10)


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot, from /proc/stat (every process, other jobs too)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])
    return total - idle, total


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("TRUNCATE run_intervention, run_escalation, run_step, run_state CASCADE")


def create_pending(conn: psycopg.Connection[Any], runs: int) -> None:
    """Record ``runs`` pending io5 runs in one statement: the rows services.start_run writes (no attempt yet)."""
    conn.execute(
        "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, input, "
        "created_at, updated_at) SELECT 'scaling-' || lpad(g::text, 7, '0'), %(workflow)s, %(fingerprint)s, "
        "'pending', 0, '', 0, '', '{}'::jsonb, now() + g * interval '1 microsecond', now() "
        "FROM generate_series(1, %(runs)s) AS g",
        {"workflow": io5.name, "fingerprint": get_workflow(io5.name).fingerprint, "runs": runs})


def peak_rss_kb(pid: int) -> int | None:
    """The process's peak resident memory so far (VmHWM, kB), or None once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None  # a zombie: exited, not yet reaped


def watch_memory(pid: int, done: threading.Event, peak: list[int]) -> None:
    """Keep the highest VmHWM of ``pid`` in ``peak[0]`` until it exits. Not ru_maxrss: a child's ru_maxrss also
    counts the pages of the parent it was forked from (the runner), whichever is the larger."""
    while not done.is_set():
        kb = peak_rss_kb(pid)
        if kb is None:
            return
        peak[0] = max(peak[0], kb)
        done.wait(0.02)


def run_worker(port: int, dbname: str, concurrency: int, *, timeout: float = 900.0) -> dict[str, Any]:
    """One resume_runs --once process; its wall time, its peak RSS (VmHWM, read while it runs) and, from
    os.wait4, its CPU time."""
    env = dict(os.environ, **app.site_env(dbname), PYTHONUNBUFFERED="1", PGAPPNAME=APP_NAME)
    env["DATABASE_URL"] = database_url(dbname, port)
    with tempfile.TemporaryFile("w+") as err:
        began = time.perf_counter()
        proc = subprocess.Popen(app.worker_command("--once", "--concurrency", str(concurrency), "--lease", "30"),
                                cwd=app.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        peak = [0]
        exited = threading.Event()
        memory = threading.Thread(target=watch_memory, args=(proc.pid, exited, peak), daemon=True)
        memory.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
            exited.set()
            memory.join(timeout=5)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"resume_runs --concurrency {concurrency} exited {proc.returncode}: {err.read()[-2000:]}")
    if not peak[0]:
        raise RuntimeError(f"resume_runs --concurrency {concurrency}: no VmHWM read while it ran")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": peak[0] / 1024}


def one_level(port: int, dbname: str, *, concurrency: int, runs: int) -> dict[str, Any]:
    """Work ``runs`` runs with one process of ``concurrency`` threads; what it did and what it used."""
    with psycopg.connect(conninfo(dbname, port), autocommit=True) as conn:
        reset(conn)
        create_pending(conn, runs)
        conn.execute("VACUUM ANALYZE run_state")
        cpu_before = machine_cpu()
        with sampling(port, dbname) as activity:
            worker = run_worker(port, dbname, concurrency)
        cpu_after = machine_cpu()
        [(span, attempts, completed, done_runs)] = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)), count(*), "
            "count(*) FILTER (WHERE status = 'completed'), "
            "(SELECT count(*) FROM run_state WHERE status = 'completed') FROM run_step").fetchall()
    steps = runs * IO_STEPS
    if done_runs != runs or attempts != steps or completed != steps:
        raise RuntimeError(f"--concurrency {concurrency}: {done_runs}/{runs} runs completed, {completed}/{attempts} "
                           f"attempts completed, expected {steps}")
    busy, total = (after - before for after, before in zip(cpu_after, cpu_before))
    span = float(span)
    return {
        **worker, "span_s": span, "steps_per_s": steps / span,
        "worker_cpu_per_wall": worker["cpu_s"] / worker["wall_s"],
        "machine_cpu_busy": busy / total if total else 0.0,
        "max_connections": activity.max_connections, "samples": activity.samples,
        "mean_active_backends": activity.active / max(1, activity.samples),
        "lock_wait_share": activity.lock_waits / max(1, activity.active),
        "waits": dict(activity.waits.most_common(6)),
        "active_samples": activity.active,
    }


def limiter(level: dict[str, Any], concurrency: int) -> str:
    """A reading of what stopped this level going faster, from its medians (the rule is in the params)."""
    ideal = concurrency / (IO_STEP_SECONDS * 1.0)
    if level["machine_cpu_busy"]["median"] >= 0.85:
        return f"CPU: the machine's cores {100 * level['machine_cpu_busy']['median']:.0f}% busy"
    if level["lock_wait_share"]["median"] >= 0.2:
        return f"lock waits: {100 * level['lock_wait_share']['median']:.0f}% of active backend samples"
    if level["worker_cpu_per_wall"]["median"] >= 0.85:
        return "the worker's one interpreter (GIL): it used a whole core"
    if level["steps_per_s"]["median"] >= 0.6 * ideal:
        return "the far calls themselves: each thread waits 20 ms a step (more threads, more steps/s)"
    return "per-step overhead in the worker and the database (neither CPU nor locks saturated)"


@dataclass(frozen=True, kw_only=True)
class Server:
    port: int
    dbname: str
    description: str
    settings: dict[str, Any]


@contextmanager
def server_for(largest: int, dbs: Databases) -> Iterator[Server]:
    """The shared server if ``largest`` threads (+ heartbeat, sampler, runner) fit in its free connections,
    else a private one with room for them, migrated."""
    shared = server_settings()
    need = largest + 1 + 3
    free = int(shared["max_connections"]) - int(shared["superuser_reserved_connections"]) - connections_in_use()
    if need + HEADROOM <= free:
        yield Server(port=PORT, dbname=dbs.app, settings=shared,
                     description=f"the shared server (max_connections {shared['max_connections']}, {free} free)")
        return
    wanted = largest + 64
    with private_pg.private_server(max_connections=wanted) as private:
        with psycopg.connect(conninfo("postgres", private.port), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(SCALING_DB)))
        env = dict(os.environ, **app.site_env(SCALING_DB))
        env["DATABASE_URL"] = database_url(SCALING_DB, private.port)
        migrated = subprocess.run([sys.executable, "manage.py", "migrate", "--skip-checks", "-v0"], cwd=app.ROOT,
                                  env=env, capture_output=True, text=True, timeout=600)
        if migrated.returncode != 0:
            raise RuntimeError(f"migrating the private server failed: {migrated.stderr[-2000:]}")
        yield Server(port=private.port, dbname=SCALING_DB, settings=private.settings,
                     description=f"a private server (max_connections {wanted}; the shared one has "
                                 f"{shared['max_connections']}, {free} free: too few for {need}), with the shared "
                                 f"one's durability settings")


def measure(*, dbs: Databases, levels: tuple[tuple[int, int], ...], repeat: int) -> dict[str, Any]:
    """Figure 10: per level (concurrency, runs), steps/s, peak RSS, CPU, connections and lock waits."""
    largest = max(c for c, _ in levels)
    samples: dict[int, list[dict[str, Any]]] = {c: [] for c, _ in levels}
    runs_at = dict(levels)
    with server_for(largest, dbs) as server:
        for _, concurrency in rotation([c for c, _ in levels], repeat):
            samples[concurrency].append(one_level(server.port, server.dbname, concurrency=concurrency,
                                                  runs=runs_at[concurrency]))
        if server.port == PORT:
            with psycopg.connect(conninfo(server.dbname), autocommit=True) as conn:
                reset(conn)
    figures: dict[str, Any] = {"levels": {}}
    numeric = ("wall_s", "span_s", "steps_per_s", "cpu_s", "worker_cpu_per_wall", "peak_rss_mb",
               "machine_cpu_busy", "mean_active_backends", "lock_wait_share")
    for concurrency, rows in samples.items():
        level: dict[str, Any] = {name: summarize([row[name] for row in rows]) for name in numeric}
        level["runs"] = runs_at[concurrency]
        level["max_connections"] = max(row["max_connections"] for row in rows)
        waits: Counter[str] = Counter()
        for row in rows:
            waits.update(row["waits"])
        active = sum(row["active_samples"] for row in rows)
        level["waits_share"] = {name: n / max(1, active) for name, n in waits.most_common(5)}
        level["ideal_steps_per_s"] = concurrency / IO_STEP_SECONDS
        level["limited_by"] = limiter(level, concurrency)
        figures["levels"][str(concurrency)] = level
    figures["params"] = {
        "levels": [list(level) for level in levels], "rounds": repeat, "steps_per_run": IO_STEPS,
        "step_sleep_ms": 1000 * IO_STEP_SECONDS, "worker_args": "--once --concurrency N --lease 30",
        "server": server.description, "server_settings": {k: server.settings[k] for k in
                                                           ("fsync", "synchronous_commit", "max_connections")},
        "steps_per_s": "steps / working span on the database's clock (min started_at to max finished_at)",
        "memory": "peak RSS of the worker process (VmHWM of /proc/<pid>/status, read every 20 ms while it ran)",
        "connections": f"most of the worker's backends seen at once (PGAPPNAME={APP_NAME}), sampled every "
                       f"{SAMPLE_EVERY_S * 1000:g} ms: its threads and its heartbeat",
        "limited_by": "CPU if the machine's cores were >= 85% busy (every process, other jobs too); else lock "
                      "waits if >= 20% of active backend samples waited on a lock; else the GIL if the worker "
                      "used >= 85% of a core; else the far calls if steps/s >= 60% of N / 20 ms",
    }
    return figures
