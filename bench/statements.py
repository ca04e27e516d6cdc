"""Where PostgreSQL's time goes in the commit-limit load, statement by statement (issue 34).

    python -m bench.statements [--runs 2000] [--workers 1] [--concurrency 8] [--declared intent|none]
                               [--out bench/results] [--name statements]

bench.commit_limit measures how much of PostgreSQL's CPU a step costs (its backends' utime + stime) and what the
step's own statement alone allows (the record's floor); this says where that CPU goes. It runs the same load
(``runs`` pending runs of 5 no-op steps, ``workers`` `resume_runs --once --concurrency C` started at once) on a
server of its own (bench.private_pg: the shared server's binaries and durability settings, on a free loopback
port, removed afterwards) started with pg_stat_statements preloaded, which the shared server is not. For each
kind of statement the workers sent (KINDS) it reports the calls per run, the executor's time per call and per
step, and the WAL records per call; the statements that ran inside them (a foreign key's check, a trigger's
insert) apart, as their time is already in their caller's. Beside it, the backends' CPU, sampled as
bench.commit_limit samples it: what the executor does not account for is the rest of a backend's work per
statement (reading and answering the protocol's messages, starting and committing each transaction, waking up).

Executor times are wall times inside the server (pg_stat_statements' total_exec_time). With more busy backends
than cores (8 threads on 2 cores, beside the worker) they include the backends' waits for a core: compare the
statements with each other there, and the executor with the backends' CPU at --concurrency 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench import app, commit_limit, private_pg
from bench.pg import conninfo
from bench.report import git_described, reproducing_command
from durableruns import conf

DB = "dr_bench_statements"
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
SHOWN = 8  # statements listed one by one in the results' table; the rest are summed

# What each statement the workers send is, told by the names of its CTEs and what it returns (pg_stat_statements
# shows a statement with its constants made parameters, so its text is matched by these, not compared whole). The
# first that matches names it; a statement none matches is named by its text. The smoke test fails if the load's
# statements stop matching, so a statement reshaped in the store is named again here.
KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("the claim (a fresh run's first intent in it)", lambda q: "claimed AS" in q or "chosen AS" in q),
    ("results held in memory, and the run's end", lambda q: "rows AS" in q and "parent_id" in q),
    ("results held in memory, and the next intent", lambda q: "rows AS" in q),
    ("the last result, and the run's end", lambda q: "fence AS" in q and "parent_id" in q),
    ("a result, and the next intent", lambda q: "fence AS" in q and "intent AS" in q),
    # a run a claim took ahead (DURABLERUNS_PREFETCH) records its first intent when it is begun, on its own
    ("a first intent on its own (a run claimed ahead)", lambda q: "fence AS" in q and "INSERT INTO run_step" in q),
    ("the claim's BEGIN, planner settings and COMMIT", lambda q: q.strip() in ("BEGIN", "COMMIT")
     or q.lstrip().startswith("SET LOCAL enable_sort") or "set_config($1, $2, $3), set_config(" in q),
    # run_step's foreign key: PostgreSQL checks each new attempt's run (its row locked FOR KEY SHARE) in a query of
    # its own, which pg_stat_statements counts apart from the statement that inserted the attempt
    ("the foreign key's check of each new attempt's run", lambda q: 'FROM ONLY "public"."run_state"' in q),
)

# The statements pg_stat_statements saw on the bench database, and who sent them (top level, or inside another).
_READ = """
SELECT s.toplevel, s.query, s.calls, s.total_exec_time, s.total_plan_time, s.wal_records
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %s AND s.query NOT LIKE '%%pg_stat_statements_reset%%'"""


def kind_of(query: str) -> str | None:
    """The name of `query`'s kind in KINDS, or None."""
    for name, matches in KINDS:
        if matches(query):
            return name
    return None


def _configure(port: int) -> None:
    """Point this process's Django at the private server's bench database, migrated, with pg_stat_statements."""
    app.configure(DB, port)
    with psycopg.connect(conninfo(DB, port), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")  # the statements inside others too
        conn.execute("SELECT pg_reload_conf()")


def one_load(port: int, *, runs: int, workers: int, concurrency: int, workflow: str) -> dict[str, Any]:
    """The load once, pg_stat_statements emptied just before the workers start and read once they have exited."""
    from bench.workflows import NOOP5_STEPS

    commit_limit.create_pending(DB, runs, workflow, port=port)
    with psycopg.connect(conninfo(DB, port), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
    with commit_limit.sampling(DB, commit_limit.APP_NAME, port=port) as seen:
        worker = commit_limit.run_workers(DB, workers, concurrency, port=port)
    with psycopg.connect(conninfo(DB, port), autocommit=True) as conn:  # before checked_span's own statement
        rows = conn.execute(_READ, (DB,)).fetchall()
    span = commit_limit.checked_span(DB, runs, port=port)
    steps = runs * NOOP5_STEPS
    kinds: dict[str, dict[str, float]] = {}
    nested: dict[str, dict[str, float]] = {}
    for toplevel, query, calls, exec_ms, plan_ms, wal in rows:
        text = " ".join(query.split())[:90]
        if toplevel:  # a statement of no known kind is named by the start of its text
            into = kinds.setdefault(kind_of(query) or text, {"calls": 0, "exec_ms": 0.0, "plan_ms": 0.0,
                                                              "wal_records": 0})
        else:
            into = nested.setdefault(text, {"calls": 0, "exec_ms": 0.0, "plan_ms": 0.0, "wal_records": 0})
        into["calls"] += calls
        into["exec_ms"] += exec_ms
        into["plan_ms"] += plan_ms
        into["wal_records"] += int(wal)
    executor_ms = sum(k["exec_ms"] + k["plan_ms"] for k in kinds.values())
    return {
        "runs": runs, "steps": steps, "span_s": span, "steps_per_s": steps / span,
        "worker_cpu_ms_per_step": 1e3 * worker["worker_cpu_s"] / steps,
        "backend_cpu_ms_per_step": 1e3 * seen.cpu_s() / steps,
        "executor_ms_per_step": executor_ms / steps,
        "kinds": {name: _per(k, runs=runs, steps=steps, executor_ms=executor_ms) for name, k in kinds.items()},
        "nested": {text: _per(k, runs=runs, steps=steps, executor_ms=executor_ms)
                   for text, k in sorted(nested.items(), key=lambda item: -item[1]["exec_ms"])[:6]},
    }


def _per(k: dict[str, float], *, runs: int, steps: int, executor_ms: float) -> dict[str, float]:
    calls = max(1, int(k["calls"]))
    return {"calls": int(k["calls"]), "calls_per_run": k["calls"] / runs,
            "exec_us_per_call": 1e3 * k["exec_ms"] / calls, "plan_us_per_call": 1e3 * k["plan_ms"] / calls,
            "exec_us_per_step": 1e3 * (k["exec_ms"] + k["plan_ms"]) / steps,
            "share_of_executor": (k["exec_ms"] + k["plan_ms"]) / executor_ms if executor_ms else 0.0,
            "wal_records_per_call": k["wal_records"] / calls}


def markdown(data: dict[str, Any]) -> str:
    meta, f = data["meta"], data["figures"]
    p = meta["params"]
    lines = [
        "# Where PostgreSQL's time goes in the commit-limit load, statement by statement",
        "",
        f"`{meta['command']}` at {meta['git']}, {meta['date']}; {p['runs']} runs of 5 no-op steps declared "
        f"`{p['declared']}`, {p['workers']} `resume_runs --once --concurrency {p['concurrency']}` "
        f"({commit_limit.prefetch_text(p.get('prefetch'))}); a private "
        f"PostgreSQL {meta['postgresql'].get('server_version', '?')} with pg_stat_statements preloaded and the "
        "shared server's durability settings.",
        "",
        f"- steps/s: {f['steps_per_s']:.0f}; CPU per step: the workers {f['worker_cpu_ms_per_step']:.3f} ms, "
        f"PostgreSQL's backends {f['backend_cpu_ms_per_step']:.3f} ms; the executor (pg_stat_statements' "
        f"execution and planning time of the statements the workers sent, a wall time: with more busy backends "
        f"than cores it counts their waits for one too) {f['executor_ms_per_step']:.3f} ms per step, "
        f"{f['executor_ms_per_step'] / f['backend_cpu_ms_per_step']:.2f} x the backends' CPU"
        if f["backend_cpu_ms_per_step"] else f"- steps/s: {f['steps_per_s']:.0f}",
        "",
        "| statement | calls per run | executor us per call | us per step | share of the executor's time | WAL "
        "records per call |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    ranked = sorted(f["kinds"].items(), key=lambda item: -item[1]["exec_us_per_step"])
    for name, k in ranked[:SHOWN]:
        lines.append(f"| {name} | {k['calls_per_run']:.2f} | {k['exec_us_per_call']:.1f} | "
                     f"{k['exec_us_per_step']:.1f} | {k['share_of_executor']:.0%} | {k['wal_records_per_call']:.1f} |")
    rest = ranked[SHOWN:]
    if rest:
        lines.append(f"| {len(rest)} other statements | {sum(k['calls_per_run'] for _, k in rest):.2f} | | "
                     f"{sum(k['exec_us_per_step'] for _, k in rest):.1f} | "
                     f"{sum(k['share_of_executor'] for _, k in rest):.0%} | |")
    lines += ["", "Inside them (their time is already in the statement that ran them):", "",
              "| statement | calls per run | us per call |", "| --- | ---: | ---: |"]
    for text, k in f["nested"].items():
        lines.append(f"| `{text}` | {k['calls_per_run']:.2f} | {k['exec_us_per_call']:.1f} |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.statements", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=None,
                        help="DURABLERUNS_PREFETCH for the workers (default: the setting's default)")
    parser.add_argument("--declared", choices=sorted(commit_limit.DECLARED), default="intent",
                        help="the no-op steps with their intents (default), or declared intent=False (none)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default="statements", help="the results files' name (default statements)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    began = time.perf_counter()
    if args.prefetch is not None:  # the workers inherit this process's environment (commit_limit.run_workers)
        os.environ["DURABLERUNS_PREFETCH"] = str(args.prefetch)
    with private_pg.private_server(max_connections=100, preload=("pg_stat_statements",)) as server:
        _configure(server.port)
        figures = one_load(server.port, runs=args.runs, workers=args.workers, concurrency=args.concurrency,
                           workflow=commit_limit.DECLARED[args.declared])
        settings = server.settings
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": reproducing_command("bench.statements", argv), "nproc": os.cpu_count(),
            "python": platform.python_version(), "postgresql": settings, "git": git_described(),
            "params": {"runs": args.runs, "workers": args.workers, "concurrency": args.concurrency,
                       "declared": args.declared, "prefetch": conf.prefetch()},
            "duration_s": time.perf_counter() - began}
    data = {"meta": meta, "figures": figures}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(data))
    print(markdown(data))
    print(f"wrote {args.out / (args.name + '.md')} and .json")


if __name__ == "__main__":
    main()
