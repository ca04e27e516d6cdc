"""How close durableruns comes to the commit limit: steps/s of no-op runs against pgbench's single-row UPDATEs.

    python -m bench.commit_limit [--runs 2000] [--workers 1,2,4] [--concurrency 8] [--rounds 3] [--pgbench-seconds 10]
                                 [--memory-runs 1000] [--db dr_bench_commit] [--out bench/results]

The load (issue 34): ``runs`` pending runs of bench.workflows.noop5 (5 no-op re_executable steps), worked by W
`manage.py resume_runs --once --concurrency C` processes started at once, for each W. Its bar: `pgbench -n -M
prepared -c N -j 2 -T S` on the same server, a custom script of one single-row UPDATE (each client its own
row, so no client waits on another's row lock), at the same number of clients N = W x C. Rounds alternate: each
round runs every worker count and every pgbench client count, in an order rotated round by round, so both sides
of each ratio see the same machine.

The record's floor (with the steps declared with intents, the default): the same pgbench, at the same clients and
in the same rounds, runs the very statement durableruns sends for a step in the middle of a run (store.attempts:
complete the started attempt, move the cursor, record the next intent), on the real tables with all their
indexes and triggers, each client chaining the attempts of a run of its own (floor_script). floor / pgbench says
how far the record itself stands from the bar; durableruns / floor, how much of the record's own rate the worker
keeps (its Python, its round trips, and what a run adds around its steps: the claim, the start, the end).

Figures per level (medians over rounds, p10-p90):
- steps/s over the working span on the database's clock (first step started to last step finished; process
  start-up is outside it, as pgbench's connection time is outside its tps), and over the processes' wall time;
- the ratio steps/s / pgbench tps at the same clients, round by round;
- commits per step: pg_stat_database.xact_commit of the bench database, before and after (the sampler and this
  runner read from another database, so they add nothing);
- statements and round trips per step: a separate, untimed pass per level runs the same load with
  bench.counted_worker (psycopg's sending methods wrapped and counted in the worker);
- CPU per step: the worker processes' own (user + system, os.wait4) and PostgreSQL's backends serving them (utime
  + stime of /proc/<pid>/stat of every backend whose application_name is the workers', sampled every 50 ms while
  they live; the last sample of each counts), against pgbench's backends' CPU per transaction read the same way;
- WAL: pg_stat_wal's records, bytes, writes and syncs per step (the whole server's: other jobs' too), and the
  wait events of the active backends (sampled every 20 ms from pg_stat_activity): IO:WALSync, LWLock:WALWrite, ...

Memory: one `resume_runs --loop --concurrency 32` process is fed ``memory-runs`` runs in 10 batches; its resident
memory (VmRSS) is read after each batch has completed. Flat: the last batch's RSS over the first's.

The benchmark owns its database (dr_bench_commit by default) and its table bench_pgbench_row.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
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

from bench import app
from bench.pg import HOST, PORT, USER, conninfo, recreate_database, server_settings
from bench.report import git_described, reproducing_command
from bench.stats import summarize
from durableruns import conf

APP_NAME = "bench-commit-worker"
PGBENCH_APP = "bench-commit-pgbench"
SAMPLE_EVERY_S = 0.02
CPU_EVERY_S = 0.05
CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
PGBENCH_SCRIPT = "UPDATE bench_pgbench_row SET n = n + 1 WHERE id = :client_id;\n"
WAL_EVENTS = ("IO:WALSync", "LWLock:WALWrite", "IO:WALWrite")
# The load's declaration (--declared): "intent", each no-op step records its intent (bench.workflows.noop5), or
# "none", the same steps declared intent=False, whose results share one commit (noop5_held, durableruns.held).
DECLARED = {"intent": "bench_noop5", "none": "bench_noop5_held"}


# -- sampling the server ---------------------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of process `pid` in seconds, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15 of stat


@dataclass
class Sampled:
    """What the samplers saw of one application's backends while a load ran."""

    samples: int = 0
    active: int = 0
    waits: Counter[str] = field(default_factory=Counter)
    backend_cpu: dict[int, float] = field(default_factory=dict)  # pid -> last CPU seconds read
    max_backends: int = 0

    def cpu_s(self) -> float:
        return sum(self.backend_cpu.values())


@contextmanager
def sampling(dbname: str, application: str, port: int = PORT) -> Iterator[Sampled]:
    """Sample the backends of `application` on `dbname` until the block ends: their wait events (every 20 ms)
    and their CPU (every 50 ms). The sampler's own connection is to the `postgres` database (of the server on
    `port`)."""
    seen = Sampled()
    done = threading.Event()

    def run() -> None:
        with psycopg.connect(conninfo("postgres", port), autocommit=True) as conn:
            last_cpu = 0.0
            while not done.is_set():
                rows = conn.execute(
                    "SELECT pid, state, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = %s AND application_name = %s", (dbname, application)).fetchall()
                seen.samples += 1
                seen.max_backends = max(seen.max_backends, len(rows))
                now = time.monotonic()
                read_cpu = now - last_cpu >= CPU_EVERY_S
                for pid, state, wait_type, wait_event in rows:
                    if state == "active":
                        seen.active += 1
                        seen.waits[f"{wait_type}:{wait_event}" if wait_type else "CPU (no wait event)"] += 1
                    if read_cpu:
                        cpu = proc_cpu_s(pid)
                        if cpu is not None:
                            seen.backend_cpu[pid] = cpu
                if read_cpu:
                    last_cpu = now
                done.wait(SAMPLE_EVERY_S)

    thread = threading.Thread(target=run, name="bench-commit-sampler", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(timeout=10)


def server_counters(dbname: str) -> dict[str, float]:
    """The counters read before and after a load: the database's commits and the server's WAL."""
    with psycopg.connect(conninfo("postgres"), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        [(commits,)] = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                                    (dbname,)).fetchall()
        [(records, fpi, wal_bytes, writes, syncs)] = conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes, wal_write, wal_sync FROM pg_stat_wal").fetchall()
    return {"commits": float(commits), "wal_records": float(records), "wal_fpi": float(fpi),
            "wal_bytes": float(wal_bytes), "wal_writes": float(writes), "wal_syncs": float(syncs)}


def rows_scanned(dbname: str) -> float:
    """Rows of run_step read by sequential scans so far (read outside the window of the commits counted)."""
    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        [(rows,)] = conn.execute("SELECT seq_tup_read FROM pg_stat_user_tables WHERE relname = 'run_step'").fetchall()
    return float(rows)


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


# -- the durableruns side ------------------------------------------------------------------------------------


# A history of completed runs (HISTORY_PER_RUN for each run of the load, at least HISTORY_LEAST), kept from one
# round to the next, as a site in service has one: on an emptied table that VACUUM ANALYZE has just recorded as
# empty, PostgreSQL plans the step's lookups of its started attempt (by run_step's primary key) as sequential
# scans, and keeps them as the table grows within the round; each step then read the whole table twice (53
# million rows of run_step for 2,000 runs), which no site with a history does, and which the floor never paid.
HISTORY_PREFIX = "history-"
HISTORY_PER_RUN = 5
HISTORY_LEAST = 200


def create_pending(dbname: str, runs: int, workflow: str = DECLARED["intent"], port: int = PORT) -> None:
    """Remove every run but the history's, complete the history if it is short, and record `runs` pending noop5
    runs in one statement (the rows start_run writes); then VACUUM ANALYZE, as a site's autovacuum would."""
    import bench.workflows  # noqa: F401  registers the loads
    from durableruns.registry import get_workflow

    declared = get_workflow(workflow)
    with psycopg.connect(conninfo(dbname, port), autocommit=True) as conn:
        conn.execute("DELETE FROM run_step WHERE run_id NOT LIKE %s", (HISTORY_PREFIX + "%",))
        conn.execute("DELETE FROM run_state WHERE run_id NOT LIKE %s", (HISTORY_PREFIX + "%",))
        [(held,)] = conn.execute("SELECT count(*) FROM run_state WHERE run_id LIKE %s",
                                 (HISTORY_PREFIX + "%",)).fetchall()
        wanted = max(HISTORY_LEAST, HISTORY_PER_RUN * runs)
        if held < wanted:
            history = {"prefix": HISTORY_PREFIX, "first": held + 1, "last": wanted, "workflow": workflow,
                       "fingerprint": declared.fingerprint, "steps": list(declared.as_plan().names)}
            conn.execute(
                "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, "
                "input, created_at, updated_at) SELECT %(prefix)s || lpad(g::text, 8, '0'), %(workflow)s, "
                "%(fingerprint)s, 'completed', cardinality(%(steps)s::text[]), '', 1, '', '{}'::jsonb, "
                "now() - interval '1 day', now() - interval '1 day' FROM generate_series(%(first)s::int, %(last)s::int) AS g",
                history)
            conn.execute(
                "INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, finished_at, result, "
                "error, resolution, owner, epoch, loop_cursor, progress) SELECT %(prefix)s || lpad(g::text, 8, '0'), "
                "s.step, 1, 'completed', %(prefix)s || lpad(g::text, 8, '0') || ':' || s.step, "
                "now() - interval '1 day', now() - interval '1 day', 'null'::jsonb, '', 'returned', '', 1, 0, "
                "'{}'::jsonb FROM generate_series(%(first)s::int, %(last)s::int) AS g, unnest(%(steps)s::text[]) AS s(step)",
                history)
        conn.execute(
            "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, input, "
            "created_at, updated_at) SELECT 'commit-' || lpad(g::text, 7, '0'), %(workflow)s, %(fingerprint)s, "
            "'pending', 0, '', 0, '', '{}'::jsonb, now() + g * interval '1 microsecond', now() "
            "FROM generate_series(1, %(runs)s) AS g",
            {"workflow": workflow, "fingerprint": declared.fingerprint, "runs": runs})
        conn.execute("VACUUM ANALYZE run_state")
        conn.execute("VACUUM ANALYZE run_step")


def checked_span(dbname: str, runs: int, port: int = PORT) -> float:
    """Raise unless every run of the load completed with each step run once; the working span on the database's
    clock."""
    from bench.workflows import NOOP5_STEPS

    with psycopg.connect(conninfo(dbname, port), autocommit=True) as conn:
        [(span, attempts, completed, done)] = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)), count(*), "
            "count(*) FILTER (WHERE status = 'completed'), "
            "(SELECT count(*) FROM run_state WHERE status = 'completed' AND run_id LIKE 'commit-%') "
            "FROM run_step WHERE run_id LIKE 'commit-%'").fetchall()
    steps = runs * NOOP5_STEPS
    if done != runs or attempts != steps or completed != steps:
        raise RuntimeError(f"{done}/{runs} runs completed, {completed}/{attempts} attempts completed, "
                           f"expected {steps}")
    return float(span)


def run_workers(dbname: str, workers: int, concurrency: int, *, counted: Path | None = None,
                root: Path = app.ROOT, timeout: float = 900.0, port: int = PORT) -> dict[str, float]:
    """Start `workers` resume_runs --once processes at once, on the server on `port`; wall seconds until the last
    exited and their summed CPU (os.wait4). With `counted`, each runs under bench.counted_worker and writes its
    counts there."""
    env = dict(os.environ, **app.site_env(dbname, port), PYTHONUNBUFFERED="1", PGAPPNAME=APP_NAME)
    args = ("--once", "--concurrency", str(concurrency), "--lease", "30")
    procs = []
    with tempfile.TemporaryDirectory(prefix="bench-commit-") as tmp:
        began = time.perf_counter()
        for n in range(workers):
            command = app.worker_command(*args)
            extra = {}
            if counted is not None:
                command = [sys.executable, "-m", "bench.counted_worker", *command[2:]]
                extra = {"BENCH_COUNTS_FILE": str(counted / f"worker-{n}.json")}
            err = open(Path(tmp) / f"worker-{n}.err", "w+")
            procs.append((subprocess.Popen(command, cwd=root, env={**env, **extra}, stdout=subprocess.DEVNULL,
                                           stderr=err), err))
        cpu = 0.0
        failures = []
        deadline = began + timeout
        for proc, err in procs:
            watchdog = threading.Timer(max(1.0, deadline - time.perf_counter()), proc.kill)
            watchdog.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                watchdog.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            cpu += usage.ru_utime + usage.ru_stime
            if proc.returncode != 0:
                err.seek(0)
                failures.append(f"exit {proc.returncode}: {err.read()[-2000:]}")
            err.close()
        wall = time.perf_counter() - began
    if failures:
        raise RuntimeError("resume_runs failed:\n" + "\n".join(failures))
    return {"wall_s": wall, "worker_cpu_s": cpu}


def durableruns_round(dbname: str, *, runs: int, workers: int, concurrency: int, workflow: str,
                      root: Path = app.ROOT) -> dict[str, Any]:
    from bench.workflows import NOOP5_STEPS

    create_pending(dbname, runs, workflow)
    scanned = rows_scanned(dbname)
    before = server_counters(dbname)
    with sampling(dbname, APP_NAME) as seen:
        worker = run_workers(dbname, workers, concurrency, root=root)
    after = server_counters(dbname)
    scanned = rows_scanned(dbname) - scanned  # the workers have exited: their statistics are flushed
    span = checked_span(dbname, runs)
    steps = runs * NOOP5_STEPS
    counters = delta(after, before)
    return {
        "span_s": span, "wall_s": worker["wall_s"], "steps_per_s": steps / span,
        "steps_per_s_wall": steps / worker["wall_s"],
        "worker_cpu_ms_per_step": 1e3 * worker["worker_cpu_s"] / steps,
        "pg_cpu_ms_per_step": 1e3 * seen.cpu_s() / steps,
        "commits_per_step": counters["commits"] / steps,
        **{f"{name}_per_step": counters[name] / steps for name in ("wal_records", "wal_fpi", "wal_bytes",
                                                                   "wal_writes", "wal_syncs")},
        "run_step_rows_scanned_per_step": scanned / steps,
        "active_backends": seen.active / max(1, seen.samples),
        "waits": dict(seen.waits), "active_samples": seen.active,
    }


def counted_pass(dbname: str, *, runs: int, workers: int, concurrency: int, workflow: str,
                 root: Path = app.ROOT) -> dict[str, float]:
    """The same load under bench.counted_worker (untimed): statements and round trips per step."""
    from bench.workflows import NOOP5_STEPS

    create_pending(dbname, runs, workflow)
    with tempfile.TemporaryDirectory(prefix="bench-commit-counts-") as tmp:
        run_workers(dbname, workers, concurrency, counted=Path(tmp), root=root)
        totals: Counter[str] = Counter()
        for path in Path(tmp).glob("worker-*.json"):
            totals.update(json.loads(path.read_text()))
    checked_span(dbname, runs)
    steps = runs * NOOP5_STEPS
    return {f"{name}_per_step": totals[name] / steps for name in ("statements", "round_trips", "pipelines",
                                                                   "commits")}


# -- the pgbench side ------------------------------------------------------------------------------------------


def pgbench_path() -> str:
    found = shutil.which("pgbench")
    if found is None:
        raise RuntimeError("pgbench is not installed: bin/setup --bench installs it")
    return found


def prepare_pgbench(dbname: str, clients: int) -> None:
    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_pgbench_row (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("INSERT INTO bench_pgbench_row (id, n) SELECT g, 0 FROM generate_series(0, %s) AS g "
                     "ON CONFLICT (id) DO NOTHING", (clients,))


def pgbench_round(dbname: str, *, clients: int, seconds: int, script: str = PGBENCH_SCRIPT,
                  defines: dict[str, str] | None = None, application: str = PGBENCH_APP) -> dict[str, Any]:
    """One pgbench run of `seconds` at `clients` clients of `script` (with `defines` as its -D variables): its tps
    (without the initial connection time), and its backends' CPU per transaction, read as the workers' are."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as file:
        file.write(script)
        file.flush()
        env = dict(os.environ, PGAPPNAME=application)
        command = [pgbench_path(), "-n", "-M", "prepared", "-c", str(clients), "-j", "2", "-T", str(seconds),
                   "-f", file.name, "-h", HOST, "-p", str(PORT), "-U", USER, dbname]
        for name, value in (defines or {}).items():
            command[1:1] = ["-D", f"{name}={value}"]
        before = server_counters(dbname)
        with sampling(dbname, application) as seen:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=seconds + 120)
        after = server_counters(dbname)
    if done.returncode != 0:
        raise RuntimeError(f"pgbench exited {done.returncode}: {done.stderr[-2000:]}")
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    processed = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
    if tps is None or processed is None:
        raise RuntimeError(f"pgbench's output has no tps: {done.stdout[-2000:]}")
    transactions = int(processed.group(1))
    counters = delta(after, before)
    return {"tps": float(tps.group(1)), "transactions": transactions,
            "pg_cpu_ms_per_tx": 1e3 * seen.cpu_s() / max(1, transactions),
            "wal_records_per_tx": counters["wal_records"] / max(1, transactions),
            "wal_syncs_per_tx": counters["wal_syncs"] / max(1, transactions),
            "waits": dict(seen.waits), "active_samples": seen.active}


# -- the record's floor: a step's own statement, driven by pgbench -----------------------------------------------

FLOOR_APP = "bench-commit-floor"
FLOOR_PREFIX = "bench-floor-"
# The values of the statement's parameters: one no-op step of a running run, completed with its result, and the
# next attempt's intent. `attempt` counts up per client (each pgbench client keeps its variables from one
# transaction to the next), so each transaction completes the attempt the one before it started.
FLOOR_DEFINES = {"attempt": "0", "run_prefix": FLOOR_PREFIX, "epoch": "1", "owner": "bench-floor", "cursor": "1",
                 "step": "noop", "i_step": "noop", "result": "null", "resolution": "returned", "i_key": "bench-floor",
                 "i_loop": "0", "i_progress": "{}", "shift": "0 seconds", "lease": "30 seconds"}


def floor_script() -> str:
    """pgbench's script for the record's floor: the very statement durableruns sends for a step in the middle of
    a run (store.attempts: complete the started attempt, move the cursor, record the next intent; fenced on the
    epoch), its %(name)s parameters made pgbench variables, each client on a run of its own."""
    from durableruns.store.attempts import _RECORD_RESULT
    from durableruns.store.sql import compact

    statement = compact(_RECORD_RESULT[(True, False)])
    special = {"run": "(:run_prefix || :client_id)", "i_attempt": ":next"}
    body = re.sub(r"%\((\w+)\)s", lambda m: special.get(m.group(1), ":" + m.group(1)), statement)
    return "\\set attempt :attempt + 1\n\\set next :attempt + 1\n" + body + ";\n"


def prepare_floor(dbname: str, clients: int) -> None:
    """One running run per pgbench client (run ids FLOOR_PREFIX + client id), each with attempt 1 of its step
    started; what earlier floor rounds wrote is removed first."""
    d = FLOOR_DEFINES
    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        conn.execute("DELETE FROM run_step WHERE run_id LIKE %s", (FLOOR_PREFIX + "%",))
        conn.execute("DELETE FROM run_state WHERE run_id LIKE %s", (FLOOR_PREFIX + "%",))
        conn.execute(
            "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, input, "
            "created_at, updated_at, lease_expires_at) SELECT %(prefix)s || g, %(workflow)s, '', 'running', "
            "%(cursor)s, %(owner)s, %(epoch)s, '', '{}'::jsonb, now(), now(), now() + interval '1 hour' "
            "FROM generate_series(0, %(last)s) AS g",
            {"prefix": FLOOR_PREFIX, "workflow": DECLARED["intent"], "cursor": int(d["cursor"]), "owner": d["owner"],
             "epoch": int(d["epoch"]), "last": clients - 1})
        conn.execute(
            "INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until, error, "
            "resolution, owner, epoch, loop_cursor, progress) SELECT %(prefix)s || g, %(step)s, 1, 'started', "
            "%(key)s, now(), now() + interval '1 hour', '', '', %(owner)s, %(epoch)s, 0, '{}'::jsonb "
            "FROM generate_series(0, %(last)s) AS g",
            {"prefix": FLOOR_PREFIX, "step": d["step"], "key": d["i_key"], "owner": d["owner"],
             "epoch": int(d["epoch"]), "last": clients - 1})


def floor_round(dbname: str, *, clients: int, seconds: int) -> dict[str, Any]:
    """The record's floor at `clients` clients: how many of a step's own statement PostgreSQL commits per second
    with nothing around it (no Python, no claim, no run's start or end). Checked: every transaction moved one
    attempt from started to completed."""
    prepare_floor(dbname, clients)
    figures = pgbench_round(dbname, clients=clients, seconds=seconds, script=floor_script(),
                            defines=FLOOR_DEFINES, application=FLOOR_APP)
    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        [(completed, started)] = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'started') "
            "FROM run_step WHERE run_id LIKE %s", (FLOOR_PREFIX + "%",)).fetchall()
        conn.execute("DELETE FROM run_step WHERE run_id LIKE %s", (FLOOR_PREFIX + "%",))
        conn.execute("DELETE FROM run_state WHERE run_id LIKE %s", (FLOOR_PREFIX + "%",))
    if completed != figures["transactions"] or started != clients:
        raise RuntimeError(f"the floor's statement did not chain: {completed} attempts completed for "
                           f"{figures['transactions']} transactions, {started} started for {clients} clients")
    return figures


# -- memory ----------------------------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def memory(dbname: str, *, runs: int, workflow: str, concurrency: int = 32, batches: int = 10) -> dict[str, Any]:
    """One --loop worker of `concurrency` threads fed `runs` runs in `batches`; its RSS after each batch."""
    from bench.workflows import NOOP5_STEPS
    from durableruns.registry import get_workflow

    create_pending(dbname, 0, workflow)
    per_batch = max(1, runs // batches)
    worker = app.LoopWorker(dbname, "--loop", "--concurrency", str(concurrency), "--lease", "30",
                            env_extra={"PGAPPNAME": APP_NAME})
    rss: list[int] = []
    try:
        worker.first_line()
        with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
            for batch in range(batches):
                conn.execute(
                    "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, "
                    "input, created_at, updated_at) SELECT 'memory-' || %(batch)s || '-' || lpad(g::text, 6, '0'), "
                    "%(workflow)s, %(fingerprint)s, 'pending', 0, '', 0, '', '{}'::jsonb, "
                    "now() + g * interval '1 microsecond', now() FROM generate_series(1, %(runs)s) AS g",
                    {"batch": batch, "workflow": workflow, "fingerprint": get_workflow(workflow).fingerprint,
                     "runs": per_batch})
                conn.execute("SELECT pg_notify('durableruns_due', '')")
                expected = per_batch * (batch + 1)
                deadline = time.monotonic() + 300
                while True:
                    [(done,)] = conn.execute("SELECT count(*) FROM run_state WHERE status = 'completed' "
                                             "AND run_id LIKE 'memory-%'").fetchall()
                    if done >= expected:
                        break
                    if time.monotonic() > deadline or worker.proc.poll() is not None:
                        raise RuntimeError(f"the --loop worker completed {done} of {expected} runs")
                    time.sleep(0.05)
                rss.append(rss_kb(worker.proc.pid))
    finally:
        worker.stop(check=False)
    return {"runs": per_batch * batches, "batches": batches, "concurrency": concurrency,
            "steps": per_batch * batches * NOOP5_STEPS, "rss_mb_after_batch": [kb / 1024 for kb in rss],
            "last_over_first": rss[-1] / rss[0], "last_over_second": rss[-1] / rss[min(1, len(rss) - 1)]}


def baseline_db(dbname: str) -> str:
    return f"{dbname}_base"


def prepare_baseline(dbname: str, root: Path) -> None:
    """The baseline checkout's own database, made anew and migrated by that checkout's own migrations."""
    recreate_database(baseline_db(dbname))
    env = dict(os.environ, **app.site_env(baseline_db(dbname)))
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--skip-checks", "-v0"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"migrating the baseline's database failed: {done.stderr[-2000:]}")


# -- the whole measurement -------------------------------------------------------------------------------------


def rotated(items: list[Any], round_no: int) -> list[Any]:
    shift = round_no % len(items)
    order = items[shift:] + items[:shift]
    return order if round_no % 2 == 0 else list(reversed(order))


def measure(*, dbname: str, runs: int, worker_counts: tuple[int, ...], concurrency: int, rounds: int,
            pgbench_seconds: int, memory_runs: int, workflow: str = DECLARED["intent"],
            baseline: Path | None = None) -> dict[str, Any]:
    clients = sorted({w * concurrency for w in worker_counts})
    prepare_pgbench(dbname, max(clients))
    jobs: list[tuple[str, int]] = [("durableruns", w) for w in worker_counts] + [("pgbench", c) for c in clients]
    with_floor = workflow == DECLARED["intent"]  # the floor is the intent-declared step's statement
    if with_floor:
        jobs += [("floor", c) for c in clients]
    if baseline is not None:
        jobs += [("baseline", w) for w in worker_counts]
    ours: dict[int, list[dict[str, Any]]] = {w: [] for w in worker_counts}
    base: dict[int, list[dict[str, Any]]] = {w: [] for w in worker_counts}
    theirs: dict[int, list[dict[str, Any]]] = {c: [] for c in clients}
    floors: dict[int, list[dict[str, Any]]] = {c: [] for c in clients}
    floor_ratios: dict[int, list[tuple[float, float]]] = {w: [] for w in worker_counts}
    ratios: dict[int, list[float]] = {w: [] for w in worker_counts}
    base_ratios: dict[int, list[float]] = {w: [] for w in worker_counts}
    for round_no in range(rounds):
        this_round: dict[tuple[str, int], dict[str, Any]] = {}
        for kind, n in rotated(jobs, round_no):
            if kind == "durableruns":
                this_round[kind, n] = durableruns_round(dbname, runs=runs, workers=n, concurrency=concurrency,
                                                        workflow=workflow)
                ours[n].append(this_round[kind, n])
            elif kind == "baseline":
                assert baseline is not None
                this_round[kind, n] = durableruns_round(baseline_db(dbname), runs=runs, workers=n,
                                                        concurrency=concurrency, workflow=workflow, root=baseline)
                base[n].append(this_round[kind, n])
            elif kind == "floor":
                this_round[kind, n] = floor_round(dbname, clients=n, seconds=pgbench_seconds)
                floors[n].append(this_round[kind, n])
            else:
                this_round[kind, n] = pgbench_round(dbname, clients=n, seconds=pgbench_seconds)
                theirs[n].append(this_round[kind, n])
            print(f"bench.commit_limit: round {round_no + 1}: {kind} {n}: "
                  f"{json.dumps({k: round(v, 4) for k, v in this_round[kind, n].items() if isinstance(v, float)})}",
                  file=sys.stderr, flush=True)
        for w in worker_counts:
            ratios[w].append(this_round["durableruns", w]["steps_per_s"]
                             / this_round["pgbench", w * concurrency]["tps"])
            if with_floor:
                floor_tps = this_round["floor", w * concurrency]["tps"]
                floor_ratios[w].append((this_round["durableruns", w]["steps_per_s"] / floor_tps,
                                        floor_tps / this_round["pgbench", w * concurrency]["tps"]))
            if baseline is not None:
                base_ratios[w].append(this_round["durableruns", w]["steps_per_s"]
                                      / this_round["baseline", w]["steps_per_s"])
    counts = {w: counted_pass(dbname, runs=runs, workers=w, concurrency=concurrency, workflow=workflow)
              for w in worker_counts}
    levels: dict[str, Any] = {}
    numeric = ("span_s", "wall_s", "steps_per_s", "steps_per_s_wall", "worker_cpu_ms_per_step", "pg_cpu_ms_per_step",
               "commits_per_step", "wal_records_per_step", "wal_fpi_per_step", "wal_bytes_per_step",
               "wal_writes_per_step", "wal_syncs_per_step", "run_step_rows_scanned_per_step", "active_backends")
    for w in worker_counts:
        rows, bench_rows = ours[w], theirs[w * concurrency]
        level: dict[str, Any] = {name: summarize([row[name] for row in rows]) for name in numeric}
        level["clients"] = w * concurrency
        level["pgbench_tps"] = summarize([row["tps"] for row in bench_rows])
        level["pgbench_pg_cpu_ms_per_tx"] = summarize([row["pg_cpu_ms_per_tx"] for row in bench_rows])
        level["pgbench_wal_syncs_per_tx"] = summarize([row["wal_syncs_per_tx"] for row in bench_rows])
        level["ratio"] = summarize(ratios[w])
        level["counted"] = counts[w]
        level["waits_share"] = _shares(rows)
        if baseline is not None:
            level["baseline"] = {name: summarize([row[name] for row in base[w]]) for name in numeric}
            level["baseline"]["waits_share"] = _shares(base[w])
            level["over_baseline"] = summarize(base_ratios[w])
        level["pgbench_waits_share"] = _shares(bench_rows)
        if with_floor:
            floor_rows = floors[w * concurrency]
            level["floor"] = {
                "tps": summarize([row["tps"] for row in floor_rows]),
                "pg_cpu_ms_per_tx": summarize([row["pg_cpu_ms_per_tx"] for row in floor_rows]),
                "wal_records_per_tx": summarize([row["wal_records_per_tx"] for row in floor_rows]),
                "durableruns_over_floor": summarize([ours_ for ours_, _ in floor_ratios[w]]),
                "floor_over_pgbench": summarize([floor for _, floor in floor_ratios[w]]),
                "waits_share": _shares(floor_rows),
            }
        levels[str(w)] = level
    figures: dict[str, Any] = {"levels": levels}
    if memory_runs:
        figures["memory"] = memory(dbname, runs=memory_runs, workflow=workflow)
    return figures


def _shares(rows: list[dict[str, Any]]) -> dict[str, float]:
    waits: Counter[str] = Counter()
    for row in rows:
        waits.update(row["waits"])
    active = sum(row["active_samples"] for row in rows)
    return {name: n / max(1, active) for name, n in waits.most_common(6)}


# -- the results file ------------------------------------------------------------------------------------------


def _m(summary: dict[str, float], digits: int = 2) -> str:
    return f"{summary['median']:,.{digits}f} ({summary['p10']:,.{digits}f}-{summary['p90']:,.{digits}f})"


DECLARED_TEXT = {
    "intent": "each records its intent before it acts, its result with the next one's intent: a commit a step",
    "none": "declared intent=False: no intent, and a run's five results share one commit (durableruns.held)",
}


def prefetch_text(prefetch: int | None) -> str:
    if prefetch is None:  # results measured before the setting
        return "one run a claim"
    return f"DURABLERUNS_PREFETCH={prefetch}: up to {prefetch} runs a claim" if prefetch > 1 else "one run a claim"


def markdown(data: dict[str, Any]) -> str:
    meta, figures = data["meta"], data["figures"]
    p = meta["params"]
    lines = ["# durableruns against the commit limit (issue 34)", "",
             f"Measured {meta['date']} on {meta['nproc']} cores (load average {meta['loadavg_start'][0]:.2f} at the "
             f"start, {meta['loadavg_end'][0]:.2f} at the end), PostgreSQL {meta['postgresql']['server_version']} "
             f"(fsync={meta['postgresql']['fsync']}, synchronous_commit={meta['postgresql']['synchronous_commit']}), "
             f"Python {meta['python']}, commit {meta['git']}; took {meta['duration_s']:.0f} s.", "",
             f"Reproduce: `{meta['command']}`", "",
             f"Load: {p['runs']:,} pending runs x 5 no-op re_executable steps "
             f"({DECLARED_TEXT[p.get('declared', 'intent')]}), W `resume_runs --once --concurrency "
             f"{p['concurrency']} --lease 30` processes ({prefetch_text(p.get('prefetch'))}); bar: `pgbench -n -M prepared -c N -j 2 -T "
             f"{p['pgbench_seconds']}` of one single-row UPDATE (each client its own row) at N = W x "
             f"{p['concurrency']} clients; {p['rounds']} rounds, the order rotated round by round. Medians (p10-p90). "
             "Each checkout's Python is compiled to bytecode first, as a deployment's is (bench.app.compile_bytecode).",
             "",
             "| workers | clients | steps/s (span) | steps/s (wall) | pgbench tps | steps/s / tps | target >= 0.35 |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for w, level in figures["levels"].items():
        verdict = "met" if level["ratio"]["median"] >= 0.35 else "not met"
        lines.append(f"| {w} | {level['clients']} | {_m(level['steps_per_s'], 0)} | {_m(level['steps_per_s_wall'], 0)} "
                     f"| {_m(level['pgbench_tps'], 0)} | {_m(level['ratio'], 3)} | {verdict} |")
    if p.get("baseline"):
        lines += ["", f"Side by side in the same rounds, the baseline checkout (commit {p['baseline_git']}) on a "
                      "database of its own, migrated by its own migrations:", "",
                  "| workers | steps/s (span) | baseline steps/s | this / baseline | PostgreSQL CPU ms/step (baseline) "
                  "| worker CPU ms/step (baseline) | WAL records/step (baseline) |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for w, level in figures["levels"].items():
            b = level["baseline"]
            lines.append(f"| {w} | {_m(level['steps_per_s'], 0)} | {_m(b['steps_per_s'], 0)} "
                         f"| {_m(level['over_baseline'], 3)} | {level['pg_cpu_ms_per_step']['median']:.3f} "
                         f"({b['pg_cpu_ms_per_step']['median']:.3f}) | {level['worker_cpu_ms_per_step']['median']:.3f} "
                         f"({b['worker_cpu_ms_per_step']['median']:.3f}) | {level['wal_records_per_step']['median']:.2f} "
                         f"({b['wal_records_per_step']['median']:.2f}) |")
    if any("floor" in level for level in figures["levels"].values()):
        lines += ["", "The record's floor, side by side in the same rounds: the statement durableruns sends for a step "
                      "in the middle of a run (complete the started attempt, move the cursor, record the next intent, "
                      "fenced on the epoch; `bench.commit_limit.floor_script`), driven by the same pgbench at the same "
                      "clients, each client on a run of its own: what PostgreSQL commits of it per second with nothing "
                      "around it (no Python, no claim, no run's start or end). floor / pgbench is the most the record "
                      "itself allows against the bar; durableruns / floor is what the worker, the claims and the runs' "
                      "starts and ends keep of that.", "",
                  "| workers | clients | floor tps | floor / pgbench | durableruns / floor | floor: PostgreSQL CPU ms/tx "
                  "| floor: WAL records/tx |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for w, level in figures["levels"].items():
            f = level["floor"]
            lines.append(f"| {w} | {level['clients']} | {_m(f['tps'], 0)} | {_m(f['floor_over_pgbench'], 3)} "
                         f"| {_m(f['durableruns_over_floor'], 3)} | {_m(f['pg_cpu_ms_per_tx'], 3)} "
                         f"| {f['wal_records_per_tx']['median']:.2f} |")
    lines += ["", "Breakdown per step (durableruns) and per transaction (pgbench):", "",
              "| workers | commits | statements | round trips | worker CPU ms | PostgreSQL backends' CPU ms "
              "| pgbench backends' CPU ms/tx | WAL records | WAL bytes | WAL syncs (pgbench /tx) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w, level in figures["levels"].items():
        c = level["counted"]
        lines.append(
            f"| {w} | {level['commits_per_step']['median']:.3f} | {c['statements_per_step']:.2f} "
            f"| {c['round_trips_per_step']:.2f} | {_m(level['worker_cpu_ms_per_step'], 3)} "
            f"| {_m(level['pg_cpu_ms_per_step'], 3)} | {_m(level['pgbench_pg_cpu_ms_per_tx'], 3)} "
            f"| {level['wal_records_per_step']['median']:.2f} | {level['wal_bytes_per_step']['median']:,.0f} "
            f"| {level['wal_syncs_per_step']['median']:.3f} ({level['pgbench_wal_syncs_per_tx']['median']:.3f}) |")
    scans = ", ".join(f"{level['run_step_rows_scanned_per_step']['median']:,.1f} ({w} worker{'s' if w != '1' else ''})"
                      for w, level in figures["levels"].items())
    lines += ["", f"Rows of run_step read by sequential scans, per step: {scans} (each step finds its attempt by "
                  "the table's primary key; the tables hold a history of completed runs, as a site in service does: "
                  "see create_pending).",
              "", "What the active backends waited on (share of samples, every 20 ms):", "",
              "| workers | durableruns' backends | pgbench's backends |", "|---:|---|---|"]
    for w, level in figures["levels"].items():
        def text(shares: dict[str, float]) -> str:
            return ", ".join(f"{name} {100 * share:.0f}%" for name, share in shares.items())
        lines.append(f"| {w} | {text(level['waits_share'])} | {text(level['pgbench_waits_share'])} |")
        if "baseline" in level:
            lines.append(f"| {w}, baseline | {text(level['baseline']['waits_share'])} | |")
    if "memory" in figures:
        mem = figures["memory"]
        rss = ", ".join(f"{mb:.1f}" for mb in mem["rss_mb_after_batch"])
        lines += ["", f"Memory: one `resume_runs --loop --concurrency {mem['concurrency']}` process fed {mem['runs']:,} "
                      f"runs in {mem['batches']} batches; VmRSS after each batch (MB): {rss}. Last / first "
                      f"{mem['last_over_first']:.3f}, last / second {mem['last_over_second']:.3f}."]
    lines += ["", "How each figure is taken: see the module's docstring (bench/commit_limit.py). The WAL counters "
                  "and the wait events are the whole server's (another job's load shows there too); the "
                  "backends' CPU misses at most the last 50 ms of each backend's life.", ""]
    if meta.get("note"):
        lines += [meta["note"], ""]
    return "\n".join(lines)


def _git_at(root: Path) -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True, text=True,
                          timeout=10)
    return done.stdout.strip() or "unknown"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.commit_limit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", default="1,2,4", help="worker process counts, comma-separated")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--memory-runs", type=int, default=1000, help="0: no memory figure")
    parser.add_argument("--db", default="dr_bench_commit")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default="commit_limit", help="the results files' name (default commit_limit)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout (e.g. a git worktree of the code before a change) whose workers run "
                             "the same load on a database of its own in the same rounds: steps/s over the baseline's")
    parser.add_argument("--prefetch", type=int, default=None,
                        help="DURABLERUNS_PREFETCH for the workers: runs a claim of their passes may take (default: "
                             "the setting's default)")
    parser.add_argument("--declared", choices=sorted(DECLARED), default="intent",
                        help="how the load's steps are declared: each records its intent (default), or none does "
                             "(intent=False: their results share one commit)")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.rounds < 1 or args.concurrency < 1 or args.pgbench_seconds < 1:
        parser.error("--runs, --rounds, --concurrency and --pgbench-seconds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    worker_counts = tuple(int(w) for w in args.workers.split(",") if w)
    began = time.perf_counter()
    if args.prefetch is not None:  # the workers inherit this process's environment (run_workers)
        os.environ["DURABLERUNS_PREFETCH"] = str(args.prefetch)
    recreate_database(args.db)
    app.configure(args.db)
    app.compile_bytecode()
    if args.baseline is not None:
        app.compile_bytecode(args.baseline.resolve())
        prepare_baseline(args.db, args.baseline.resolve())
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": reproducing_command("bench.commit_limit", argv), "nproc": os.cpu_count(),
        "loadavg_start": os.getloadavg(), "python": platform.python_version(), "postgresql": server_settings(),
        "git": git_described(), "note": args.note,
        "params": {"runs": args.runs, "declared": args.declared, "prefetch": conf.prefetch(),
                   "workers": list(worker_counts), "concurrency": args.concurrency,
                   "rounds": args.rounds, "pgbench_seconds": args.pgbench_seconds, "memory_runs": args.memory_runs,
                   "baseline": str(args.baseline) if args.baseline else None,
                   "baseline_git": _git_at(args.baseline) if args.baseline else None},
    }
    figures = measure(dbname=args.db, runs=args.runs, worker_counts=worker_counts, concurrency=args.concurrency,
                      rounds=args.rounds, pgbench_seconds=args.pgbench_seconds, memory_runs=args.memory_runs,
                      workflow=DECLARED[args.declared], baseline=args.baseline.resolve() if args.baseline is not None else None)
    meta.update(loadavg_end=os.getloadavg(), duration_s=time.perf_counter() - began)
    data = {"meta": meta, "figures": figures}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(data))
    for w, level in figures["levels"].items():
        print(f"{w} worker(s): {level['steps_per_s']['median']:.0f} steps/s, pgbench {level['pgbench_tps']['median']:.0f}"
              f" tps at {level['clients']} clients: {level['ratio']['median']:.3f}")
    print(f"wrote {args.out / (args.name + '.md')} and .json")


if __name__ == "__main__":
    main()
