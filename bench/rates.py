"""Step rate limits (issue 35), on PostgreSQL.

- schedule: three `resume_runs --loop` workers (4 threads each) and 60 runs whose one step has rate="5/s" (one
  bucket). The time from the first step's start to the last run's completion (both the database's clock) against
  the ideal schedule, 60 / 5 x 1 s = 12 s (target: within 1.3 x); and the most calls in any 1 s window of the
  steps' own clock (the limit: 5). Each round runs the 60 afresh, the workers already listening.
- claim cost: store.claim of due runs with 10,000 runs waiting for their turn under a rate limit (waiting, each
  with its turn as wake time, an hour and more ahead, and its reason) against none, side by side in rotating rounds,
  in schemas as bench/claim_cost.py builds them (target: within 1.2 x).

Run: `python -m bench.rates [--runs 60] [--rounds 3] [--claims 300] [--claim-rounds 9] [--waiting 10000]
[--out bench/results/rates.json]` (its own database, dr_rates_bench by default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RUNS = 60
RATE = 5  # a second
WAITING = 10_000


def schedule_round(runs: int) -> dict[str, float]:
    """`runs` runs through the three listening workers: elapsed (database clock), its ratio to the ideal (runs / 5
    x 1 s), and the most calls in a 1 s window of the steps' clock."""
    import durableruns
    from bench import app
    from bench.workflows import rated

    app.clear()  # row by row: a TRUNCATE beside the listening workers' statements can deadlock with them
    app.execute("DELETE FROM run_rate_turn")
    ids = [durableruns.start(rated.name, {"n": n}) for n in range(runs)]
    deadline = time.monotonic() + 120
    while app.execute("SELECT count(*) FROM run_state WHERE status = 'completed'")[0][0] < runs:
        if time.monotonic() > deadline:
            raise RuntimeError("the rate-limited runs did not complete in 120 s")
        time.sleep(0.1)
    (elapsed,) = app.execute(
        "SELECT extract(epoch FROM (SELECT max(updated_at) FROM run_state) - (SELECT min(started_at) FROM run_step))")[0]
    calls = sorted(r[0] for r in app.execute("SELECT (result->>'at')::float8 FROM run_step WHERE status = 'completed'"))
    if len(calls) != len(ids):
        raise RuntimeError(f"{len(calls)} calls for {len(ids)} runs")
    busiest = max(sum(1 for u in calls if t <= u < t + 1.0) for t in calls)
    return {"elapsed_seconds": float(elapsed), "over_ideal": float(elapsed) / (runs / RATE),
            "most_calls_in_1s": busiest, "calls_span_seconds": calls[-1] - calls[0]}


def _schema(name: str, *, waiting: int) -> str:
    """Schema `name`: empty copies of run_state and run_step with the public tables' indexes, and `waiting` runs
    waiting for their turns (as durableruns.store.rates leaves them: waiting, the turn as wake time, its reason)."""
    from bench import app, claim_cost
    from bench.workflows import rated

    indexes, _ = claim_cost._definitions()
    app.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    app.execute(f"CREATE SCHEMA {name}")
    for table in claim_cost.TABLES:
        app.execute(f"CREATE TABLE {name}.{table} (LIKE public.{table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    if waiting:
        app.execute(
            f"INSERT INTO {name}.run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
            "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
            "SELECT 'turn-' || g, %s, %s, 'waiting', 0, '', 1, NULL, w, "
            "'waiting for the rate limit of rated_call until ' || to_char(w, 'HH24:MI:SS'), '{}'::jsonb, "
            "now() - interval '1 day' + g * interval '1 millisecond', now() "
            "FROM generate_series(1, %s) g, LATERAL (SELECT now() + interval '1 hour' + g * interval '200 ms') t(w)",
            [rated.name, rated.fingerprint, waiting])
    for definition in indexes:
        app.execute(definition.replace(" ON public.", f" ON {name}.", 1))
    for table in claim_cost.TABLES:
        app.execute(f"VACUUM ANALYZE {name}.{table}")
    return name


def _workload(schema: str, *, claims: int) -> Any:
    from bench import app, claim_cost
    from bench.stats import Workload
    from bench.workflows import noop9
    from durableruns import store

    def setup() -> None:
        app.execute(f"DELETE FROM {schema}.run_step")
        app.execute(f"DELETE FROM {schema}.run_state WHERE run_id LIKE 'due-%%'")
        app.execute(
            f"INSERT INTO {schema}.run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
            "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
            "SELECT 'due-' || g, %s, %s, 'pending', 0, '', 0, NULL, NULL, '', '{}'::jsonb, "
            "now() + g * interval '1 microsecond', now() FROM generate_series(1, %s) g",
            [noop9.name, noop9.fingerprint, claims])
        for table in claim_cost.TABLES:  # the last round's claimed runs gone from the indexes, as autovacuum does
            app.execute(f"VACUUM {schema}.{table}")
        app.execute(f"SET search_path TO {schema}, public")

    def work(_prepared: None) -> None:
        try:
            for _ in range(claims):
                claimed = store.claim(owner=claim_cost.OWNER, lease_seconds=30)
                if claimed is None or not claimed.lease.run_id.startswith("due-"):
                    raise RuntimeError(f"{schema}: took {claimed and claimed.lease.run_id!r}, not a due run")
        finally:
            app.execute("SET search_path TO DEFAULT")

    return Workload(name=schema, run=work, ops=claims, setup=setup)


def _buffers(schema: str, *, claims: int = 20) -> dict[str, Any]:
    """The claim as the engine sends it, on `schema`, run `claims` times under EXPLAIN (ANALYZE, BUFFERS), each
    taking a due run: the buffers each touched (shared hit + read), a count the machine's load does not move."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench import app
    from durableruns import store

    _workload(schema, claims=claims + 1).setup()  # one for the claim captured, the rest explained
    with CaptureQueriesContext(connection) as captured:
        store.claim(owner="bench-explain", lease_seconds=30)
    statement = captured.captured_queries[-1]["sql"]
    planning, _, claim = statement.partition(";\n")  # the claim's planner settings, then the claim
    prefix = f"{planning};\n" if claim else ""
    buffers = []
    with connection.cursor() as cursor:
        for _ in range(claims):
            cursor.execute(f"{prefix}EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim or planning}")
            if prefix:
                cursor.nextset()
            top = cursor.fetchone()[0]
            top = (json.loads(top) if isinstance(top, str) else top)[0]["Plan"]
            buffers.append(top["Shared Hit Blocks"] + top["Shared Read Blocks"])
    app.execute("SET search_path TO DEFAULT")
    return {"buffers_per_claim_median": statistics.median(buffers), "buffers_per_claim_max": max(buffers)}


def claim_cost_figure(*, claims: int, rounds: int, waiting: int) -> dict[str, Any]:
    from bench import app
    from bench.stats import interleave, ratio

    none = _schema("rates_none_waiting", waiting=0)
    many = _schema("rates_many_waiting", waiting=waiting)
    ms = interleave([_workload(none, claims=claims), _workload(many, claims=claims)], repeat=rounds)
    buffers = {"none_waiting": _buffers(none), f"{waiting}_waiting_for_a_turn": _buffers(many)}
    for schema in (none, many):
        app.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return {"ms_per_claim": {"none_waiting": ms[none], f"{waiting}_waiting_for_a_turn": ms[many]},
            "waiting_over_none": ratio(ms[many], ms[none]) | {"target": "<= 1.2"},
            "explained": buffers,
            "params": {"claims_per_round": claims, "rounds": rounds, "waiting": waiting,
                       "waiting_runs": "waiting, wake_at their turns (1 h + 200 ms apart), older than the due runs"}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default="dr_rates_bench")
    parser.add_argument("--runs", type=int, default=RUNS, help="runs of the schedule, each round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the schedule")
    parser.add_argument("--waiting", type=int, default=WAITING, help="runs waiting for a turn in the claim cost")
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--claim-rounds", type=int, default=9)
    parser.add_argument("--only", default="schedule,claim_cost")
    parser.add_argument("--out", type=Path, default=Path("bench/results/rates.json"))
    args = parser.parse_args(argv)
    from bench import app

    app.configure(args.db)
    import bench.workflows  # noqa: F401  (registers the bench workflows in this process)
    from durableruns import conf

    only = set(args.only.split(","))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    figures: dict[str, Any] = {
        "command": " ".join(["python -m bench.rates", *(argv if argv is not None else sys.argv[1:])]),
        "measured_at": f"{commit}, load average {' '.join(load)} (a shared machine: the ratios are the figures)",
    }
    if "schedule" in only:
        env = {"DJANGO_SETTINGS_MODULE": "bench.settings"}
        workers = [app.LoopWorker(args.db, "--loop", "--concurrency", "4", "--worker", f"w{n}", env_extra=env)
                   for n in range(3)]
        try:
            for worker in workers:
                worker.first_line()
            rounds = [schedule_round(args.runs) for _ in range(args.rounds)]
        finally:
            app.stop_all(workers)
        over = [r["over_ideal"] for r in rounds]
        figures["schedule"] = {
            "runs": args.runs, "rate": f"{RATE}/s", "workers": "3 x --loop --concurrency 4",
            "ideal_seconds": args.runs / RATE,
            "margin_seconds": conf.rate_margin().total_seconds(),
            "over_ideal": {"median": statistics.median(over), "max": max(over), "target": "<= 1.3"},
            "most_calls_in_any_1s": max(r["most_calls_in_1s"] for r in rounds), "rounds": rounds,
        }
    if "claim_cost" in only:
        figures["claim_cost"] = claim_cost_figure(claims=args.claims, rounds=args.claim_rounds, waiting=args.waiting)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
