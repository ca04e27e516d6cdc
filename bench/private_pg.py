"""A PostgreSQL server of the benchmarks' own, for a figure that needs more connections than the shared one allows.

128 worker threads need 128 connections plus the heartbeat's, and the machine's server (max_connections 100 by
default, shared with other jobs) cannot give them; its configuration is not the suite's to change. So the
scaling figure, when its largest level does not fit, runs every level on a private server started here: the
same PostgreSQL binaries, initialised in a temporary folder and listening on a free loopback port, with the
shared server's durability settings (fsync, synchronous_commit, full_page_writes, shared_buffers, wal_sync_method)
and only max_connections raised. It is stopped and removed on exit, whatever happens.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.pg import HOST, USER, server_settings

COPIED = ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "wal_sync_method")


@dataclass(frozen=True, kw_only=True)
class PrivateServer:
    port: int
    settings: dict[str, Any]


def _bin(version: str) -> Path:
    major = version.split(".")[0].split()[0]
    return Path(f"/usr/lib/postgresql/{major}/bin")


def _as_postgres(*command: str) -> None:
    """Run a server command as the `postgres` user (initdb refuses root)."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _setting(name: str, value: str) -> str:
    # SHOW gives shared_buffers in its own unit (e.g. "128MB"), which the server takes back as is.
    return f"-c {name}={value}"


@contextmanager
def private_server(*, max_connections: int, preload: tuple[str, ...] = ()) -> Iterator[PrivateServer]:
    """Start a private PostgreSQL with the shared server's durability settings and ``max_connections``, with the
    libraries in ``preload`` (shared_preload_libraries: pg_stat_statements for bench.statements)."""
    shared = server_settings()
    binaries = _bin(shared["server_version"])
    folder = Path(tempfile.mkdtemp(prefix="durableruns-bench-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    data = folder / "data"
    port = _free_port()
    try:
        _as_postgres(str(binaries / "initdb"), "-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync")
        options = " ".join([f"-p {port}", f"-k {folder}", f"-c listen_addresses={HOST}",
                            _setting("max_connections", str(max_connections)),
                            *([_setting("shared_preload_libraries", ",".join(preload))] if preload else []),
                            *(_setting(name, str(shared[name])) for name in COPIED)])
        _as_postgres(str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-o", options,
                     "-w", "-t", "120", "start")
        yield PrivateServer(port=port, settings=server_settings(port))
    finally:
        if (data / "postmaster.pid").exists():
            prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            subprocess.run([*prefix, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                           capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
