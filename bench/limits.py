"""The claim's cost with runs parked by concurrency limits (issue 23), on PostgreSQL, side by side in one run.

Three workloads, each timing `claims` calls of store.claim (the engine's claim) per round, rounds rotating:

- no_limits: the deploy declares no limit, so the claim is the statement without limits (what every site
  without limits sends), over due runs of a workflow without one;
- limited_none_parked: the deploy declares a limited workflow (concurrency_key, limit 1 per key); the due runs
  are of that workflow, each under a key of its own, so every claim goes through durableruns_admit (the key's
  lock, its count, the look for a parked run to let go); 100 other keys each have a run holding their slot;
- limited_10000_parked: the same, plus 10,000 runs parked by those 100 full keys (100 each): waiting with the
  reason limits.PARKED and no wake time, as the claim leaves them.

The figure the issue sets is limited_10000_parked over limited_none_parked (target <= 1.2); limited_none_parked
over no_limits is what a limit costs a claim at all. Beside the times, each limited schema's claim is run 20 times
under EXPLAIN (ANALYZE, BUFFERS): the buffers a claim touches do not move with the machine's load, the times do. Each workload has its own schema (run_state and run_step as
bench/claim_cost.py copies them, indexes included); the functions durableruns_admit and durableruns_unpark name
run_state unqualified, so they work on the schema the claim's search_path points at.

Run: `python -m bench.limits [--claims 300] [--rounds 9] [--out bench/results/limits.json]` (its own database,
dr_limits_bench by default).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

PARKED_RUNS = 10_000
FULL_KEYS = 100
LIMITED = "bench_limited"


def _schema(name: str, *, parked: int) -> str:
    """Schema `name`: empty copies of run_state and run_step with the public tables' indexes, `FULL_KEYS` keys of
    the limited workflow each with a running run holding its slot, and `parked` runs parked under them."""
    from bench import app, claim_cost
    from durableruns.limits import PARKED
    from durableruns.registry import get_workflow

    workflow = get_workflow(LIMITED)
    indexes, _ = claim_cost._definitions()
    app.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    app.execute(f"CREATE SCHEMA {name}")
    for table in claim_cost.TABLES:
        app.execute(f"CREATE TABLE {name}.{table} (LIKE public.{table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    columns = ("run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, lease_expires_at, wake_at, reason, "
               "input, concurrency_key, created_at, updated_at")
    app.execute(
        f"INSERT INTO {name}.run_state ({columns}) "
        "SELECT 'holder-' || g, %s, %s, 'running', 0, 'bench-holder', 1, now() + interval '1 day', NULL, '', "
        "'{}'::jsonb, 'key-' || g, now() - interval '2 days' + g * interval '1 millisecond', now() "
        "FROM generate_series(1, %s) g", [workflow.name, workflow.fingerprint, FULL_KEYS])
    if parked:
        app.execute(
            f"INSERT INTO {name}.run_state ({columns}) "
            "SELECT 'parked-' || g, %s, %s, 'waiting', 0, '', 0, NULL, NULL, %s, '{}'::jsonb, "
            "'key-' || (1 + g %% %s), now() - interval '1 day' + g * interval '1 millisecond', now() "
            "FROM generate_series(1, %s) g", [workflow.name, workflow.fingerprint, PARKED, FULL_KEYS, parked])
    for definition in indexes:
        app.execute(definition.replace(" ON public.", f" ON {name}.", 1))
    for table in claim_cost.TABLES:
        app.execute(f"VACUUM ANALYZE {name}.{table}")
    return name


def _workload(schema: str, *, claims: int, limited: bool) -> Any:
    from bench import app, claim_cost
    from bench.stats import Workload
    from bench.workflows import noop9
    from durableruns import store
    from durableruns.registry import get_workflow

    workflow = get_workflow(LIMITED) if limited else noop9
    key = "'due-' || g" if limited else "NULL"

    def setup() -> None:
        app.execute(f"DELETE FROM {schema}.run_step")
        app.execute(f"DELETE FROM {schema}.run_state WHERE run_id LIKE 'due-%%'")
        app.execute(
            f"INSERT INTO {schema}.run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
            "lease_expires_at, wake_at, reason, input, concurrency_key, created_at, updated_at) "
            f"SELECT 'due-' || g, %s, %s, 'pending', 0, '', 0, NULL, NULL, '', '{{}}'::jsonb, {key}, "
            "now() + g * interval '1 microsecond', now() FROM generate_series(1, %s) g",
            [workflow.name, workflow.fingerprint, claims])
        for table in claim_cost.TABLES:  # the last round's claimed runs gone from the indexes, as autovacuum does
            app.execute(f"VACUUM {schema}.{table}")
        app.execute(f"SET search_path TO {schema}, public")  # the tables here; the functions in public

    def work(_prepared: None) -> None:
        original = store.claims.limits_json
        if not limited:  # this deploy as one without limits: the claim without them
            store.claims.limits_json = lambda: None  # type: ignore[assignment]
        try:
            for _ in range(claims):
                claimed = store.claim(owner=claim_cost.OWNER, lease_seconds=30)
                if claimed is None or not claimed.lease.run_id.startswith("due-"):
                    raise RuntimeError(f"{schema}: took {claimed and claimed.lease.run_id!r}, not a due run")
        finally:
            store.claims.limits_json = original  # type: ignore[method-assign]
            app.execute("SET search_path TO DEFAULT")

    return Workload(name=schema, run=work, ops=claims, setup=setup)


def _explain(schema: str, *, claims: int = 20) -> dict[str, Any]:
    """The limited claim as the engine sends it, on `schema`, run `claims` times under EXPLAIN (ANALYZE, BUFFERS)
    (each takes a due run): the buffers each touched (shared hit + read, the whole statement with the admission
    function's own queries), a count the machine's load does not move, and the last one's plan."""
    import statistics

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench import app
    from durableruns import store

    _workload(schema, claims=claims + 1, limited=True).setup()  # one for the claim captured, the rest explained
    with CaptureQueriesContext(connection) as captured:
        store.claim(owner="bench-explain", lease_seconds=30)
    statement = captured.captured_queries[-1]["sql"]
    planning, _, claim = statement.partition(";\n")
    buffers, plan = [], []
    with connection.cursor() as cursor:
        for _ in range(claims):
            cursor.execute(f"{planning};\nEXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim}")
            cursor.nextset()
            top = cursor.fetchone()[0]
            top = (json.loads(top) if isinstance(top, str) else top)[0]["Plan"]
            buffers.append(top["Shared Hit Blocks"] + top["Shared Read Blocks"])
        cursor.execute(f"{planning};\nEXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {claim}")
        cursor.nextset()
        plan = [row[0] for row in cursor.fetchall()]
    app.execute("SET search_path TO DEFAULT")
    return {"buffers_per_claim_median": statistics.median(buffers), "buffers_per_claim_max": max(buffers),
            "plan": plan}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default="dr_limits_bench")
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path("bench/results/limits.json"))
    args = parser.parse_args(argv)
    from bench import app

    app.configure(args.db)
    import bench.workflows  # noqa: F401  (registers the bench workflows in this process)
    from bench.stats import interleave, ratio
    from durableruns import Workflow

    # Declared here only, so that no other bench's claims become limited ones.
    limited = Workflow(LIMITED, concurrency_key=lambda input: input["key"])
    limited.step(policy="re_executable")(lambda ctx: None)

    none = _schema("limits_none_parked", parked=0)
    many = _schema("limits_many_parked", parked=PARKED_RUNS)
    bare = _schema("limits_no_limits", parked=0)
    workloads = [_workload(bare, claims=args.claims, limited=False),
                 _workload(none, claims=args.claims, limited=True),
                 _workload(many, claims=args.claims, limited=True)]
    ms = interleave(workloads, repeat=args.rounds)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    figures = {
        "command": " ".join(["python -m bench.limits", *(argv if argv is not None else sys.argv[1:])]),
        "measured_at": f"{commit}, load average {' '.join(load)} (a shared machine: the ratios, measured side by "
                       "side in rotating rounds, are the figures; absolute times move with the load)",
        "ms_per_claim": {"no_limits": ms[bare], "limited_none_parked": ms[none],
                         f"limited_{PARKED_RUNS}_parked": ms[many]},
        "parked_over_none": ratio(ms[many], ms[none]) | {"target": "<= 1.2"},
        "limited_over_no_limits": ratio(ms[none], ms[bare]),
        "explained": {"limited_none_parked": _explain(none), f"limited_{PARKED_RUNS}_parked": _explain(many)},
        "params": {"claims_per_round": args.claims, "rounds": args.rounds, "parked": PARKED_RUNS,
                   "full_keys": FULL_KEYS, "limit": "1 per key (concurrency_key)",
                   "due_runs": "pending, newer than the parked ones; limited: each under a key of its own"},
    }
    for schema in (none, many, bare):
        app.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "explained"}, indent=2, default=str))
    for name, explained in figures["explained"].items():
        print(name, "buffers per claim: median", explained["buffers_per_claim_median"], "max",
              explained["buffers_per_claim_max"])


if __name__ == "__main__":
    main()
