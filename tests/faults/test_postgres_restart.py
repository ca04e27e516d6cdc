"""PostgreSQL restarted in the middle of a pass: the worker stops with a clear message, nothing is half recorded,
and the next pass completes the runs with one effect per key.

The shared server on 5432 is never touched: the test starts a private PostgreSQL 15 in a temporary folder on a
free port (initdb refuses root, so it runs as the `postgres` user), migrates it, and restarts that one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from project.purchasing.far import FarSystems
from tests.conftest import ROOT, wait_until
from tests.faults.support import PLAN, PO_ENV, SYSTEM_OF, duplicates, reference

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PG_BIN = Path("/usr/lib/postgresql/15/bin")
RUNS = 6
LINES = 40  # priced at 50 ms each: 2 s of quote per run, checkpointed at line 25


@dataclass(frozen=True)
class PrivatePostgres:
    folder: Path
    port: int

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/durableruns"

    def pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "server.log"),
                           *args)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
            return conn.execute(sql).fetchall()


def as_postgres(*command: str) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL 15 of this test's own, migrated; stopped and removed afterwards whatever happens."""
    folder = Path(tempfile.mkdtemp(prefix="durableruns-pg-"))
    shutil.chown(folder, "postgres", "postgres")
    pg = PrivatePostgres(folder=folder, port=free_port())
    try:
        as_postgres(str(PG_BIN / "initdb"), "-D", str(pg.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                    "--no-sync")
        options = f"-p {pg.port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        pg.pg_ctl("-o", options, "-w", "start")
        as_postgres(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "durableruns")
        migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--skip-checks", "-v0"], cwd=ROOT,
                                 env=site_env(pg), capture_output=True, text=True, timeout=120)
        assert migrate.returncode == 0, migrate.stderr
        yield pg
    finally:
        if (pg.data / "postmaster.pid").exists():
            subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(pg.data),
                            "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def site_env(pg: PrivatePostgres, **extra: str) -> dict[str, str]:
    env = dict(os.environ, DATABASE_URL=pg.url, DJANGO_SETTINGS_MODULE="project.settings", PYTHONUNBUFFERED="1")
    env.update(PO_ENV)
    env.update(extra)
    return env


def manage(pg: PrivatePostgres, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=site_env(pg, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_whole_facts(pg: PrivatePostgres) -> dict[str, str]:
    """Every row is a whole fact; each run's cursor sits right after its completed steps. Returns statuses."""
    half = pg.query("SELECT run_id, step, attempt, status FROM run_step WHERE "
                    "(status = 'completed' AND (result IS NULL OR finished_at IS NULL)) OR "
                    "(status = 'started' AND (result IS NOT NULL OR finished_at IS NOT NULL))")
    assert half == [], f"half-recorded attempts: {half}"
    runs = dict((r, (status, cursor)) for r, status, cursor in pg.query("SELECT run_id, status, cursor FROM run_state"))
    latest: dict[str, dict[str, str]] = {r: {} for r in runs}
    for run_id, step, status in pg.query("SELECT run_id, step, status FROM run_step ORDER BY run_id, step, attempt"):
        latest[run_id][step] = status
    for run_id, (status, cursor) in runs.items():
        done = [s for s in PLAN if latest[run_id].get(s) == "completed"]
        assert tuple(done) == PLAN[: len(done)] and cursor == len(done), (run_id, status, cursor, latest[run_id])
        in_doubt = [s for s, st in latest[run_id].items() if st == "started"]
        assert in_doubt in ([], [PLAN[cursor]] if cursor < len(PLAN) else []), (run_id, cursor, in_doubt)
        assert (status == "completed") == (cursor == len(PLAN)), (run_id, status, cursor)
    return {r: s for r, (s, _) in runs.items()}


@pytest.mark.parametrize("mode", ["fast", "immediate"])  # a clean shutdown, and a crash with WAL recovery
def test_a_database_restart_mid_pass_stops_the_worker_cleanly_and_the_next_pass_finishes(
    private_postgres: PrivatePostgres, far: FarSystems, mode: str
) -> None:
    pg = private_postgres
    inputs = {f"PO-restart-{i}": {"reference": reference(300 + i), "buyer": "Harbour Foods", "line_count": LINES}
              for i in range(RUNS)}
    starter = manage(pg, "shell", "-c", "import json, durableruns\n"
                     f"for run_id, data in json.loads({json.dumps(json.dumps(inputs))}).items():\n"
                     "    durableruns.start('purchase_order', data, run_id=run_id)\n")
    out, err = starter.communicate(timeout=60)
    assert starter.returncode == 0, err

    # A pass over the runs, restarted while the second run's quote is past its checkpoint at line 25: the
    # heartbeat thread (every lease/3) meets the lost connection before the step's next write does.
    # One thread: the runs go one after another, so the test knows which one the restart catches mid-step.
    worker = manage(pg, "resume_runs", "--skip-checks", "--loop", "--interval", "0.1", "--lease", "1",
                    "--concurrency", "1", PURCHASING_QUOTE_ITEM_SECONDS="0.05")
    try:
        wait_until(lambda: pg.query("SELECT loop_cursor FROM run_step WHERE run_id = 'PO-restart-1' "
                                    "AND step = 'quote'") == [(25,)], timeout=60, what="the second quote's checkpoint")
        assert worker.poll() is None
        pg.pg_ctl("-m", mode, "-w", "restart")  # every open connection is terminated
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.communicate()

    # The worker stopped by itself, non-zero, with one clear message and no traceback.
    assert worker.returncode == 1, (worker.returncode, out, err)
    assert "database error, pass stopped" in err and "nothing is half recorded" in err, err
    assert "Traceback" not in err and "Exception in thread" not in err, err

    statuses = assert_whole_facts(pg)
    assert statuses["PO-restart-0"] == "completed" and statuses["PO-restart-1"] == "running", statuses
    assert set(statuses.values()) <= {"completed", "running", "pending"}, statuses

    # The next pass (once the dead pass's lease has run out) completes every run, each effect once.
    time.sleep(1.1)
    again = manage(pg, "resume_runs", "--skip-checks", "--lease", "1")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and "Traceback" not in err, out + err
    statuses = assert_whole_facts(pg)
    assert set(statuses.values()) == {"completed"}, (statuses, out)
    assert duplicates(far) == {}
    for step, system in SYSTEM_OF.items():
        assert getattr(far, system).counts_by_key() == {f"PO-restart-{i}:{step}": 1 for i in range(RUNS)}
    assert far.email.count() == RUNS
