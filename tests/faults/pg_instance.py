"""A private PostgreSQL instance for the fault tests that must stop, restart or cut off the database server.

The shared server on 5432 is never touched: each test gets a fresh cluster in a temporary folder on a free port
(initdb refuses root, so it runs as the `postgres` user), created with trust authentication, migrated, and
removed afterwards whatever happens. It listens on 127.0.0.1 and, for the partition rig, on further addresses
(a bridge the test created), trusting the networks it is told to.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import ROOT
from tests.faults.support import PO_ENV

# The newest server installed (Debian's postgresql package puts each major version in its own folder).
PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))[-1]


@dataclass(frozen=True)
class PrivatePostgres:
    folder: Path
    port: int
    host: str = "127.0.0.1"  # the address clients are given in `url`

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        return self.url_via(self.host)

    def url_via(self, address: str) -> str:
        return f"postgres://postgres@{address}:{self.port}/durableruns"

    def pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "server.log"),
                           *args)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement over loopback, in its own connection (so a cut-off host's network is no matter)."""
        with psycopg.connect(self.url_via("127.0.0.1").replace("postgres://", "postgresql://"),
                             autocommit=True, connect_timeout=10) as conn:
            return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text() if path.exists() else ""


def as_postgres(*command: str) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def private_postgres(*, listen: Sequence[str] = ("127.0.0.1",), trust: Sequence[str] = ()) -> Iterator[PrivatePostgres]:
    """A migrated PostgreSQL of the caller's own, listening on `listen` and trusting the CIDRs in `trust` (besides
    loopback); stopped and removed afterwards whatever happens. Clients are given the first address."""
    folder = Path(tempfile.mkdtemp(prefix="durableruns-pg-"))
    shutil.chown(folder, "postgres", "postgres")
    pg = PrivatePostgres(folder=folder, port=free_port(), host=listen[0])
    try:
        as_postgres(str(PG_BIN / "initdb"), "-D", str(pg.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                    "--no-sync")
        if trust:
            with (pg.data / "pg_hba.conf").open("a") as hba:
                hba.writelines(f"host all all {network} trust\n" for network in trust)
        options = f"-p {pg.port} -k {folder} -c listen_addresses={','.join(listen)} -c fsync=off"
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
    """The environment of a site process on `pg`: the purchase order's shrunk lags, then `extra`."""
    env = dict(os.environ, DATABASE_URL=pg.url, DJANGO_SETTINGS_MODULE="project.settings", PYTHONUNBUFFERED="1")
    env.update(PO_ENV)
    env.update(extra)
    return env


def manage(pg: PrivatePostgres, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=site_env(pg, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextmanager
def private_standby(primary: PrivatePostgres, *, name: str = "standby1") -> Iterator[PrivatePostgres]:
    """A streaming standby of `primary`, made with pg_basebackup (-R: it follows the primary), whose walreceiver
    reports itself as `name` (its cluster_name: what synchronous_standby_names names); stopped and removed
    afterwards whatever happens."""
    folder = Path(tempfile.mkdtemp(prefix="durableruns-standby-"))
    shutil.chown(folder, "postgres", "postgres")
    standby = PrivatePostgres(folder=folder, port=free_port())
    try:
        as_postgres(str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                    "-D", str(standby.data), "-R", "-X", "stream", "-c", "fast", "--no-sync")
        standby.pg_ctl("-o", f"-p {standby.port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off "
                             f"-c cluster_name={name}", "-w", "start")
        yield standby
    finally:
        if (standby.data / "postmaster.pid").exists():
            subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(standby.data),
                            "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
