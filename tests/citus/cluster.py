"""A private Citus cluster for the Citus lane (docs/citus.md): a coordinator and two workers, three initdb's on
free loopback ports, each with shared_preload_libraries = 'citus', joined with citus_set_coordinator_host and
citus_add_node; stopped and removed afterwards whatever happens.

The shared server on 5432 is never touched. Citus must be installed for the newest PostgreSQL (`bin/setup
--citus`). Two-phase commit records are kept (citus.recover_2pc_interval = -1) so a test can read every one the
cluster made in pg_dist_transaction (tests/citus/test_cluster.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

# The newest server installed (Debian puts each major version in its own folder), as tests/faults/pg_instance.py;
# this module imports nothing of the suite's, so the benchmarks start the same cluster (bench/citus.py).
PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))[-1]
CITUS_SO = PG_BIN.parent / "lib" / "citus.so"
DATABASE = "durableruns"


@dataclass(frozen=True)
class Node:
    folder: Path
    port: int

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement in a connection of its own, autocommitted."""
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}", autocommit=True, connect_timeout=10
        ) as conn:
            cursor = conn.execute(sql, params)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text() if path.exists() else ""


@dataclass(frozen=True)
class Cluster:
    coordinator: Node
    workers: tuple[Node, ...]

    @property
    def url(self) -> str:
        """Where the site connects: the coordinator."""
        return self.coordinator.url

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.coordinator, *self.workers)


def as_postgres(*command: str) -> subprocess.CompletedProcess[str]:
    """Run a server tool as the postgres user (initdb refuses root)."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def citus_installed() -> bool:
    return CITUS_SO.exists()


@contextmanager
def _node(settings: str, *, citus: bool = True) -> Iterator[Node]:
    folder = Path(tempfile.mkdtemp(prefix="durableruns-citus-"))
    shutil.chown(folder, "postgres", "postgres")
    node = Node(folder=folder, port=free_port())
    try:
        as_postgres(
            str(PG_BIN / "initdb"), "-D", str(node.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"
        )
        with (node.data / "postgresql.conf").open("a") as conf:
            conf.write(settings)
        as_postgres(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(node.data),
            "-l",
            str(folder / "server.log"),
            "-o",
            f"-p {node.port} -k {folder} -c listen_addresses=127.0.0.1",
            "-w",
            "start",
        )
        as_postgres(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(node.port), "-U", "postgres", DATABASE)
        if citus:
            node.query("CREATE EXTENSION citus")
        yield node
    finally:
        if (node.data / "postmaster.pid").exists():
            prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            subprocess.run(
                [*prefix, str(PG_BIN / "pg_ctl"), "-D", str(node.data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(folder, ignore_errors=True)


# Small machines: few connections per node, no fsync (tests only), 2PC records kept for the tests to read.
SETTINGS = """
shared_preload_libraries = 'citus'
fsync = off
synchronous_commit = off
max_connections = 200
shared_buffers = 64MB
citus.recover_2pc_interval = -1
citus.max_adaptive_executor_pool_size = 4
"""


@contextmanager
def single_node(settings: str = SETTINGS) -> Iterator[Node]:
    """One plain PostgreSQL with the cluster's settings and no Citus: the benchmarks' one node (bench/citus.py)."""
    plain = "\n".join(line for line in settings.splitlines() if "citus" not in line) + "\n"
    with _node(plain, citus=False) as node:
        yield node


@contextmanager
def citus_cluster(*, workers: int = 2, shard_count: int = 8, settings: str = SETTINGS) -> Iterator[Cluster]:
    """A coordinator and `workers` worker nodes, each its own PostgreSQL on a free loopback port, the workers added
    to the coordinator's metadata; `shard_count` is the coordinator's citus.shard_count (what
    create_distributed_table uses when distribute_runs lays the record out)."""
    if not citus_installed():
        raise RuntimeError(f"Citus is not installed ({CITUS_SO} is missing): run `bin/setup --citus` first")
    with ExitStack() as stack:
        coordinator = stack.enter_context(_node(settings + f"citus.shard_count = {shard_count}\n"))
        nodes = tuple(stack.enter_context(_node(settings)) for _ in range(workers))
        coordinator.query("SELECT citus_set_coordinator_host('127.0.0.1', %s)", [coordinator.port])
        for node in nodes:
            coordinator.query("SELECT citus_add_node('127.0.0.1', %s)", [node.port])
        yield Cluster(coordinator=coordinator, workers=nodes)
