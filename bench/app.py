"""The Django side of the benchmarks: configure the site on a bench database, run SQL on its connection,
count the commits it makes, and start real `manage.py resume_runs` worker processes.

Workers are the very command cron runs, on the bench database, with the bench workflows registered. This
module imports no model, so the runner can import it before Django is set up (bench.records builds rows).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import django
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction

from bench.pg import PORT, database_url, ensure_database

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW_MODULES = "bench.workflows"
BIG_LIMIT = 10_000_000  # --limit for workers that should take every due run


def site_env(dbname: str, port: int = PORT) -> dict[str, str]:
    """The environment of a process of the site on the bench database (of the server on ``port``), with the bench
    workflows."""
    return {"DATABASE_URL": database_url(dbname, port), "DJANGO_SETTINGS_MODULE": "project.settings",
            "DURABLERUNS_WORKFLOW_MODULES": WORKFLOW_MODULES,
            "PURCHASING_RECONCILIATION_CRON": ""}  # the demo's nightly schedule is not what is measured


def configure(dbname: str, port: int = PORT) -> None:
    """Point this process's Django at ``dbname`` (created if missing, on the server on ``port``) and bring its
    schema up to date."""
    ensure_database(dbname, port)
    if settings.configured:
        current = settings.DATABASES["default"]["NAME"]
        if current != dbname:
            raise RuntimeError(f"Django is already configured on {current!r}, not the bench database {dbname!r}")
    os.environ.update(site_env(dbname, port))
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def execute(statement: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run one statement on Django's connection (autocommit: its own transaction); return its rows, if any."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def reset() -> None:
    """Empty durableruns' tables in the bench database."""
    execute("TRUNCATE run_intervention, run_escalation, run_step, run_state CASCADE")


def clear() -> None:
    """Empty durableruns' tables row by row, as a running site's tables never are truncated: TRUNCATE gives each
    table a new file, which invalidates every connected worker's cached plans, so each connection would parse and
    plan its statements again on its next uses (a warmed-up worker's measured batch would pay that again)."""
    with transaction.atomic():
        for table in ("run_intervention", "run_escalation", "run_step", "run_state"):
            execute(f"DELETE FROM {table}")  # the names above, not input


def status_counts() -> dict[str, int]:
    """How many runs are in each status."""
    return {status: count for status, count in execute("SELECT status, count(*) FROM run_state GROUP BY status")}


# -- counting commits ------------------------------------------------------------------------------------


_WRITES = ("INSERT", "UPDATE", "DELETE")


def is_write(query: str) -> bool:
    """Whether a query string writes: one of its statements (they share one transaction) is an INSERT, UPDATE
    or DELETE, or a WITH whose CTEs are."""
    return any(_statement_writes(statement) for statement in query.split(";"))


def _statement_writes(statement: str) -> bool:
    text = statement.lstrip().upper()
    head = text.split(None, 1)[0] if text else ""
    if head in _WRITES:
        return True
    return head == "WITH" and any(f"{verb} " in text for verb in _WRITES)


@dataclass
class Commits:
    """Transactions Django's connection committed while counting: writing ones (WAL flushed) and reads."""

    writes: int = 0
    reads: int = 0
    statements: list[str] = field(default_factory=list)
    # Inside an atomic block the commit comes later: counted once, by an on_commit callback.
    _block_open: bool = field(default=False, init=False, repr=False)
    _block_wrote: bool = field(default=False, init=False, repr=False)

    def _block_committed(self) -> None:
        if self._block_wrote:
            self.writes += 1
        else:
            self.reads += 1
        self._block_open = self._block_wrote = False

    def seen(self, statement: str) -> None:
        self.statements.append(statement)
        if connection.in_atomic_block:
            if not self._block_open:
                self._block_open = True
                transaction.on_commit(self._block_committed)
            self._block_wrote = self._block_wrote or is_write(statement)
            return
        self._block_open = self._block_wrote = False  # autocommit: each statement is its own transaction
        if is_write(statement):
            self.writes += 1
        else:
            self.reads += 1


@contextmanager
def counting_commits() -> Iterator[Commits]:
    """Count the transactions this thread's connection commits (a statement in autocommit is one)."""
    commits = Commits()

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        commits.seen(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield commits


# -- worker processes ------------------------------------------------------------------------------------


# What a site process imports from the checkout itself rather than from site-packages.
SOURCES = ("durableruns", "project", "bench", "manage.py")


def compile_bytecode(root: Path = ROOT) -> None:
    """Compile the checkout's Python at `root` (durableruns, the demo site, the bench) to bytecode before anything is
    timed, as a deployment's installed packages are (pip compiles what it installs). A shell that sets
    PYTHONDONTWRITEBYTECODE would otherwise have every worker process compile them anew at its start (0.1 s of a
    0.5 s start-up on this machine), which Django, psycopg and DBOS, loaded compiled from site-packages, never pay."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *SOURCES], cwd=root, check=True,
                   stdout=subprocess.DEVNULL)


def worker_command(*args: str) -> list[str]:
    return [sys.executable, "manage.py", "resume_runs", "--skip-checks", *args]


@dataclass(frozen=True, kw_only=True)
class WorkersRun:
    """How a batch of workers started together went: wall seconds until the last exited, and each exit."""

    seconds: float
    returncodes: tuple[int, ...]


def run_workers(dbname: str, count: int, *args: str, timeout: float = 1800.0, env_extra: dict[str, str] | None = None,
                exits: tuple[int, ...] = (0,)) -> WorkersRun:
    """Start ``count`` resume_runs processes at once and wait for all; raise if any exits otherwise than ``exits``
    (a return code, negative for a signal)."""
    env = dict(os.environ, **site_env(dbname), PYTHONUNBUFFERED="1", **(env_extra or {}))
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp, ExitStack() as files:
        errs = [files.enter_context(open(Path(tmp) / f"worker-{i}.err", "w+")) for i in range(count)]
        began = time.perf_counter()
        procs = [subprocess.Popen(worker_command(*args), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
                 for err in errs]
        try:
            codes = tuple(proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - began))) for proc in procs)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        seconds = time.perf_counter() - began
        failures = []
        for code, err in zip(codes, errs):
            if code not in exits:
                err.seek(0)
                failures.append(f"exit {code}: {err.read()[-2000:]}")
    if failures:
        raise RuntimeError("resume_runs failed:\n" + "\n".join(failures))
    return WorkersRun(seconds=seconds, returncodes=codes)


class LoopWorker:
    """A `resume_runs --loop` process on the bench database, started at once; its stdout is read as it comes."""

    READY = ": working, lease"  # the first line a --loop worker writes, once it picks work up (how, it says)

    def __init__(self, dbname: str, *args: str, env_extra: dict[str, str] | None = None) -> None:
        env = dict(os.environ, **site_env(dbname), PYTHONUNBUFFERED="1")
        env.update(env_extra or {})
        self.lines: list[str] = []
        self.errors: list[str] = []  # its stderr, read as it comes too (a pipe nobody read would fill up)
        self.started = threading.Event()
        self.proc = subprocess.Popen(worker_command(*args), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_errors, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.READY in line:
                self.started.set()

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line)

    def first_line(self, timeout: float = 120.0) -> str:
        """The worker's first line, once it has written it; raise (the worker stopped) if it does not in time."""
        if not self.started.wait(timeout):
            self.stop(check=False)
            raise RuntimeError(f"the --loop worker did not start: {self.lines[-5:]}")
        return next(line for line in self.lines if self.READY in line)

    def stop(self, *, check: bool = True) -> int:
        """SIGTERM, then wait for it to exit (an idle thread notices at once; a busy one after its step); kill it
        after 60 s. With `check`, raise unless it exited 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self._readers:  # to the end of both pipes: its summary line is the last on stdout
            reader.join(timeout=5)
        err = "".join(self.errors)
        if check and self.proc.returncode != 0:
            raise RuntimeError(f"the --loop worker exited {self.proc.returncode}: {err[-2000:]}")
        return self.proc.returncode


def stop_all(workers: Sequence[LoopWorker]) -> None:
    """Stop every worker (each one, whatever another's exit); then raise if any exited otherwise than 0."""
    failures = []
    for worker in workers:
        try:
            worker.stop()
        except RuntimeError as exc:
            failures.append(str(exc))
    if failures:
        raise RuntimeError("\n".join(failures))


def work_all(dbname: str, workers: int) -> WorkersRun:
    """Run ``workers`` resume_runs processes of one thread each (as the figure has always been measured; the
    I/O-bound and scaling figures measure threads) that take every due run (--lease 30) until none is due."""
    return run_workers(dbname, workers, "--limit", str(BIG_LIMIT), "--lease", "30", "--concurrency", "1")


def startup_seconds(dbname: str) -> float:
    """Wall seconds of one resume_runs process that finds nothing due: the fixed cost of a worker process."""
    reset()
    return run_workers(dbname, 1, "--limit", "1").seconds
