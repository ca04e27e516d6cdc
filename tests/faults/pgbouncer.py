"""A private PgBouncer in transaction pooling, on a free loopback port, in front of a database the tests use.

Debian's pgbouncer package (`bin/setup --services` installs it) runs as the `postgres` user (it refuses root),
with its configuration, log and pid file in a temporary folder, and is stopped and removed afterwards whatever
happens. The PostgreSQL server behind it is never reconfigured. Its pool is smaller than the clients it serves,
so consecutive transactions of one client do run on different server connections: a prepared statement or a
LISTEN that outlives its transaction is then really lost, as it would be in production.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.faults.pg_instance import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@dataclass(frozen=True)
class PgBouncer:
    folder: Path
    port: int
    database: str

    @property
    def url(self) -> str:
        """A DATABASE_URL through the pooler (the pooler's alias has the database's own name)."""
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def show(self, what: str) -> list[tuple[object, ...]]:
        """SHOW `what` on the pooler's admin console (SHOW POOLS, SHOW SERVERS, ...)."""
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="pgbouncer",
                             autocommit=True, prepare_threshold=None) as conn:
            return conn.execute(f"SHOW {what}").fetchall()  # type: ignore[arg-type]

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text() if path.exists() else ""


@contextmanager
def pgbouncer(*, host: str, port: int, database: str, pool_size: int = 3) -> Iterator[PgBouncer]:
    """PgBouncer with `pool_mode = transaction` on 127.0.0.1:<free port>, serving `database` of the PostgreSQL at
    host:port under the same name, with at most `pool_size` server connections."""
    if not Path(PGBOUNCER).exists():
        raise AssertionError("pgbouncer is missing: `bin/setup --services` installs Debian's pgbouncer")
    folder = Path(tempfile.mkdtemp(prefix="durableruns-pgbouncer-"))
    bouncer = PgBouncer(folder=folder, port=free_port(), database=database)
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{database} = host={host} port={port} dbname={database} user=postgres\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {bouncer.port}\nunix_socket_dir =\n"
        "auth_type = any\nadmin_users = postgres\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
        "server_reset_query =\nserver_check_delay = 0\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
    )
    shutil.chown(folder, "postgres", "postgres")
    for path in folder.iterdir():
        shutil.chown(path, "postgres", "postgres")
    proc = subprocess.Popen(["runuser", "-u", "postgres", "--", PGBOUNCER, str(folder / "pgbouncer.ini")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 20
        while True:
            try:
                bouncer.show("VERSION")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > end:
                    raise AssertionError(f"pgbouncer did not start:\n{bouncer.log()}") from None
                time.sleep(0.05)
        yield bouncer
    finally:
        if proc.poll() is None:
            # runuser passes SIGTERM on; PgBouncer's own pid is in its pid file
            pid = folder / "pgbouncer.pid"
            if pid.exists():
                subprocess.run(["kill", "-INT", pid.read_text().strip()], capture_output=True)
            else:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
