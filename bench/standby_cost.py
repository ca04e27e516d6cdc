"""What it costs a step to have its intent commit wait for a standby (DURABLERUNS_STANDBY_INTENTS).

    python -m bench.standby_cost [--runs 100] [--rounds 5]

A private primary and a streaming standby made from it with pg_basebackup (both on this machine, loopback, the
server's default durability: fsync on), the standby named in the primary's synchronous_standby_names. The same
9-step runs of no-op steps declared wait_for_standby=True (bench.workflows.guarded9) are worked by one
resume_due pass in this process, one thread, under four set-ups, interleaved round by round:

    async             synchronous_commit = local: no commit waits for the standby (asynchronous replication)
    intents on        ... and DURABLERUNS_STANDBY_INTENTS = "on": each intent commit waits for the standby's flush
    intents remote_apply   ... = "remote_apply": each waits until the standby has applied it
    all sync          synchronous_commit = on server-wide: every commit waits (the whole site synchronous)

Nine intents per run: the first rides on its own commit (a protected first step does not ride on the claim),
each later one on the previous step's result. The figure is the wall time per step; the extra cost of a
protected step is its difference from `async`. Beside it, the floor: one-row UPDATEs committed by raw psycopg
at the local level, with SET LOCAL synchronous_commit = on, and with the server's level on. Results go to
bench/results/standby_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SETUPS = ("async", "intents on", "intents remote_apply", "all sync")


def _bin() -> Path:
    return sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))[-1]


def _as_postgres(*command: str) -> None:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data: Path, folder: Path, port: int, *extra: str) -> None:
    options = " ".join([f"-p {port}", f"-k {folder}", "-c listen_addresses=127.0.0.1", *extra])
    _as_postgres(str(_bin() / "pg_ctl"), "-D", str(data), "-l", str(folder / f"{data.name}.log"), "-o", options,
                 "-w", "-t", "120", "start")


@contextmanager
def primary_and_standby() -> Iterator[tuple[int, int]]:
    """A private primary and its streaming standby (cluster_name standby1); their ports. Removed on exit."""
    folder = Path(tempfile.mkdtemp(prefix="durableruns-bench-standby-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    primary, standby = folder / "primary", folder / "standby"
    ports = (_free_port(), _free_port())
    try:
        _as_postgres(str(_bin() / "initdb"), "-D", str(primary), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        _start(primary, folder, ports[0])
        _as_postgres(str(_bin() / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(ports[0]), "-U", "postgres",
                     "-D", str(standby), "-R", "-X", "stream", "-c", "fast")
        _start(standby, folder, ports[1], "-c cluster_name=standby1")
        yield ports
    finally:
        for data in (standby, primary):
            if (data / "postmaster.pid").exists():
                prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
                subprocess.run([*prefix, str(_bin() / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                               capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def _admin(port: int, *statements: str) -> list[Any]:
    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        answers = []
        for statement in statements:
            cursor = conn.execute(statement)  # type: ignore[arg-type]
            answers.append(cursor.fetchall() if cursor.description else None)
        return answers


def _server_on(port: int, synchronous_commit: str) -> None:
    _admin(port, f"ALTER SYSTEM SET synchronous_commit = '{synchronous_commit}'", "SELECT pg_reload_conf()")
    time.sleep(0.3)  # every backend reads the reloaded file before its next statement


FLOOR = ("local commit", "local + SET LOCAL synchronous_commit = on", "server synchronous_commit = on")


def floor(port: int, *, commits: int, rounds: int) -> dict[str, Any]:
    """The same three commits without durableruns: a one-row UPDATE committed by raw psycopg, under the server's
    local level, with SET LOCAL synchronous_commit = on in its transaction, and with the server's level on."""
    seconds: dict[str, list[float]] = {name: [] for name in FLOOR}
    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n int)")
        conn.execute("INSERT INTO bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING")
        for _ in range(rounds):
            for name in FLOOR:
                _server_on(port, "on" if name.startswith("server") else "local")
                began = time.perf_counter()
                for _ in range(commits):
                    with conn.transaction():
                        if "SET LOCAL" in name:
                            conn.execute("SET LOCAL synchronous_commit = on")
                        conn.execute("UPDATE bench_floor SET n = n + 1 WHERE id = 1")
                seconds[name].append((time.perf_counter() - began) / commits)
    return {name: {"ms_per_commit": round(statistics.median(values) * 1000, 3),
                   "rounds_ms": [round(v * 1000, 3) for v in values]} for name, values in seconds.items()}


def measure(port: int, *, runs: int, rounds: int) -> dict[str, Any]:
    from django.db import connections
    from django.test import override_settings

    from bench.workflows import NOOP_STEPS, guarded9
    from durableruns import services

    seconds: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    for _ in range(rounds):
        for setup in SETUPS:
            _server_on(port, "on" if setup == "all sync" else "local")
            connections.close_all()  # a fresh backend: nothing cached from the previous set-up
            level = setup.split()[1] if setup.startswith("intents") else None
            for _ in range(runs):
                services.start_run(guarded9.name, {})
            with override_settings(DURABLERUNS_STANDBY_INTENTS=level):
                began = time.perf_counter()
                report = services.resume_due(concurrency=1)
                took = time.perf_counter() - began
            done = report.counts().get("completed", 0)
            if done != runs:
                raise RuntimeError(f"{setup}: {report.summary()}")
            seconds[setup].append(took / (runs * NOOP_STEPS))
    base = statistics.median(seconds["async"])
    return {setup: {"ms_per_step": round(statistics.median(values) * 1000, 3),
                    "extra_ms_per_step": round((statistics.median(values) - base) * 1000, 3),
                    "rounds_ms": [round(v * 1000, 3) for v in values]} for setup, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs of 9 steps per set-up per round (100)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each set-up once per round (5)")
    args = parser.parse_args()
    with primary_and_standby() as (primary, _standby):
        _admin(primary, "CREATE DATABASE durableruns", "ALTER SYSTEM SET synchronous_standby_names = 'standby1'",
               "SELECT pg_reload_conf()")
        os.environ.update(DATABASE_URL=f"postgres://postgres@127.0.0.1:{primary}/durableruns",
                          DJANGO_SETTINGS_MODULE="project.settings", DURABLERUNS_WORKFLOW_MODULES="bench.workflows",
                          PURCHASING_RECONCILIATION_CRON="")
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        end = time.monotonic() + 30
        while _admin(primary, "SELECT sync_state FROM pg_stat_replication")[0] != [("sync",)]:
            if time.monotonic() > end:
                raise RuntimeError("the standby did not become synchronous")
            time.sleep(0.2)
        figures = measure(primary, runs=args.runs, rounds=args.rounds)
        commits = floor(primary, commits=args.runs * 9, rounds=args.rounds)
        version = _admin(primary, "SELECT version()")[0][0][0]
    result = {"command": f"python -m bench.standby_cost --runs {args.runs} --rounds {args.rounds}",
              "server": version, "runs_per_setup_per_round": args.runs, "steps_per_run": 9, "setups": figures,
              "floor": commits}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "standby_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
