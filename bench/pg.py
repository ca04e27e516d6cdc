"""Where the benchmarks' PostgreSQL is and which databases they own, and what the server is set to.

Every benchmark module takes its database names from here, so one run (or the smoke test, under its own
prefix) never touches another run's databases, nor the project's own (``durableruns``, ``test_*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

HOST = "127.0.0.1"
PORT = 5432
USER = "postgres"


@dataclass(frozen=True, kw_only=True)
class Databases:
    """The databases one benchmark run owns: raw floor tables, the Django app's, and DBOS's two."""

    floor: str = "durableruns_bench"
    app: str = "dr_bench_app"
    dbos_steps: str = "dbos_bench_sys"
    dbos_recovery: str = "dbos_bench_recovery_sys"
    dbos_io: str = "dbos_bench_io_sys"

    @classmethod
    def named(cls, prefix: str | None) -> Databases:
        """The default names, or with ``prefix`` a separate set (``<prefix>_floor``, ``<prefix>_app``, ...)."""
        if not prefix:
            return cls()
        return cls(floor=f"{prefix}_floor", app=f"{prefix}_app", dbos_steps=f"{prefix}_dbos_steps",
                   dbos_recovery=f"{prefix}_dbos_recovery", dbos_io=f"{prefix}_dbos_io")


def conninfo(dbname: str, port: int = PORT) -> str:
    return f"host={HOST} port={port} user={USER} dbname={dbname}"


def database_url(dbname: str, port: int = PORT) -> str:
    return f"postgresql://{USER}@{HOST}:{port}/{dbname}"


def ensure_database(dbname: str, port: int = PORT) -> None:
    """Create ``dbname`` on the local server (on ``port``) if it does not exist."""
    with psycopg.connect(conninfo("postgres", port), autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if exists is None:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


def recreate_database(dbname: str, *, template: str | None = None) -> None:
    """Drop (terminating any sessions) and create ``dbname`` so a measurement starts empty, or as a copy of
    ``template`` (which must have no session of its own)."""
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        admin.execute(create)


def server_settings(port: int = PORT) -> dict[str, Any]:
    """The server facts a reader needs to judge the figures: version and durability settings."""
    names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes",
             "shared_buffers", "max_connections", "superuser_reserved_connections")
    with psycopg.connect(conninfo("postgres", port), autocommit=True) as conn:
        settings = {name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]  # type: ignore[index]
                    for name in names}
        settings["version"] = conn.execute("SELECT version()").fetchone()[0]  # type: ignore[index]
    return settings


def connections_in_use(port: int = PORT) -> int:
    """Backends connected to the server now, every database and every client (other jobs on the machine too)."""
    with psycopg.connect(conninfo("postgres", port), autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                                ).fetchone()[0])  # type: ignore[index]
