"""What the record's CHECK constraints cost a step's own statement, against the same database without them.

    python -m bench.check_cost [--rounds 4] [--seconds 5] [--clients 1] [--db dr_bench_checks] [--out bench/results]

The statement is the one the commit limit's floor runs (bench.commit_limit.floor_script: complete a step's started
attempt, move the run's cursor, record the next intent; fenced on the epoch), driven by pgbench at ``clients``
clients for ``seconds`` a round. It runs on a database migrated as a site's is (``db``) and on a copy of it with
the CHECK constraints of run_state and run_step dropped (``<db>_unchecked``); the two sides alternate, the order
rotated round by round. pgbench's sessions run with synchronous_commit off, so that the wait for the WAL flush,
the same on both sides, does not hide what the server spends on the statement itself. Each round is checked:
every transaction moved one attempt from started to completed.

PostgreSQL 15 reads a CHECK constraint from its stored text, folds its constants and compiles it at every
execution of a statement that writes its table, and a step's statement writes three rows (run_state, and run_step
twice). The figure says what that costs; the record keeps its checks (docs/costs.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import app
from bench.commit_limit import DEFAULT_OUT, floor_round
from bench.pg import conninfo, recreate_database, server_settings
from bench.report import git_described, reproducing_command
from bench.stats import ratio, rotation, summarize

TABLES = ("run_state", "run_step")


def checks_of(dbname: str) -> list[tuple[str, str, str]]:
    """The CHECK constraints of the record's two tables in ``dbname``: (table, name, definition)."""
    with psycopg.connect(conninfo(dbname), autocommit=True) as conn:
        return conn.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE contype = 'c' AND conrelid::regclass::text = ANY(%s) ORDER BY 1, 2", (list(TABLES),)).fetchall()


def copy_without_checks(dbname: str) -> str:
    """A copy of ``dbname`` (its schema and rows) with the CHECK constraints of run_state and run_step dropped."""
    unchecked = f"{dbname}_unchecked"
    recreate_database(unchecked, template=dbname)
    with psycopg.connect(conninfo(unchecked), autocommit=True) as conn:
        for table, name, _ in checks_of(unchecked):
            conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(sql.Identifier(table),
                                                                              sql.Identifier(name)))
    if checks_of(unchecked):
        raise RuntimeError(f"{unchecked} still has CHECK constraints")
    return unchecked


def measure(*, dbname: str, rounds: int, seconds: int, clients: int) -> dict[str, Any]:
    """Rounds of the step's statement on both sides; their tps and the backends' CPU per statement."""
    from django.db import connections

    checks = checks_of(dbname)
    if not checks:
        raise RuntimeError(f"{dbname} has no CHECK constraints on {', '.join(TABLES)}: nothing to compare")
    connections.close_all()  # a template database must have no other session
    unchecked = copy_without_checks(dbname)
    sides = {"checked": dbname, "unchecked": unchecked}
    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for _, name in rotation(tuple(sides), rounds):
        seen[name].append(floor_round(sides[name], clients=clients, seconds=seconds))
    figures: dict[str, Any] = {
        name: {"tps": summarize([r["tps"] for r in rows]),
               "pg_cpu_ms_per_statement": summarize([r["pg_cpu_ms_per_tx"] for r in rows])}
        for name, rows in seen.items()
    }
    figures["checked_over_unchecked_tps"] = ratio(figures["checked"]["tps"], figures["unchecked"]["tps"])
    figures["checks"] = [{"table": table, "name": name, "definition": definition}
                         for table, name, definition in checks]
    return figures


def markdown(data: dict[str, Any]) -> str:
    meta, f = data["meta"], data["figures"]
    p = meta["params"]
    share = f["checked_over_unchecked_tps"]
    lines = [
        "# What the record's CHECK constraints cost a step's statement", "",
        f"Measured {meta['date']} on {meta['nproc']} cores, PostgreSQL {meta['postgresql']['server_version']}, "
        f"Python {meta['python']}, commit {meta['git']}; took {meta['duration_s']:.0f} s.", "",
        f"Reproduce: `{meta['command']}`", "",
        f"The step's own statement (bench.commit_limit.floor_script), pgbench at {p['clients']} client(s), "
        f"{p['seconds']} s a round, {p['rounds']} rounds alternating, synchronous_commit off for pgbench's sessions; "
        "on a migrated database and on a copy of it without the CHECK constraints of run_state and run_step. "
        "Medians (p10-p90).", "",
        "| side | statements/s | PostgreSQL CPU ms per statement |",
        "|---|---:|---:|",
    ]
    for name in ("checked", "unchecked"):
        side = f[name]
        lines.append(f"| {name} | {side['tps']['median']:,.0f} ({side['tps']['p10']:,.0f}-{side['tps']['p90']:,.0f}) "
                     f"| {side['pg_cpu_ms_per_statement']['median']:.3f} |")
    lines += ["", f"With the checks, {share['ratio']:.3f} of the statements per second without them (spread "
              f"{share['low']:.3f}-{share['high']:.3f}).", "", "The checks:", ""]
    lines += [f"- {c['table']}: `{c['name']}` {c['definition']}" for c in f["checks"]]
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.check_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--db", default="dr_bench_checks")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds < 1 or args.clients < 1:
        parser.error("--rounds, --seconds and --clients must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    began = time.perf_counter()
    os.environ["PGOPTIONS"] = "-c synchronous_commit=off"  # pgbench's sessions inherit it (commit_limit.pgbench_round)
    recreate_database(args.db)
    app.configure(args.db)
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": reproducing_command("bench.check_cost", argv), "nproc": os.cpu_count(),
        "python": platform.python_version(), "postgresql": server_settings(), "git": git_described(),
        "params": {"rounds": args.rounds, "seconds": args.seconds, "clients": args.clients},
    }
    figures = measure(dbname=args.db, rounds=args.rounds, seconds=args.seconds, clients=args.clients)
    meta["duration_s"] = time.perf_counter() - began
    data = {"meta": meta, "figures": figures}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_cost.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    (args.out / "check_cost.md").write_text(markdown(data))
    share = figures["checked_over_unchecked_tps"]
    print(f"checked {figures['checked']['tps']['median']:.0f} statements/s, unchecked "
          f"{figures['unchecked']['tps']['median']:.0f}: {share['ratio']:.3f} (spread {share['low']:.3f}-"
          f"{share['high']:.3f})")
    print(f"wrote {args.out / 'check_cost.md'} and .json")


if __name__ == "__main__":
    main()
