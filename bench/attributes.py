"""What `GET /api/runs/?attr=po:<value>` costs at 10,000 runs and at 1,000,000: the ORM query the API runs
(durableruns.api.views: the runs with their attempts and attributes prefetched, newest first, filtered by
services.with_attributes, the cursor paginator's page of 50 and one), on PostgreSQL.

Two databases of the bench's own, one with 10,000 runs and one with 1,000,000, each written with one INSERT ...
SELECT generate_series a table (finished runs, as a site keeps by the million), each run with two attributes:
`po` (unique, PO-00000001...) and `buyer` (one of 1,000). Searches for random po values of runs that exist
alternate between the two, so the machine's load moves both alike: each timed from the client (the whole ORM
query and its prefetches), and the server's own execution time of the page's statement under EXPLAIN ANALYZE;
the plan must read an index of run_attribute. The figure the issue holds is the ratio of the client medians,
large over small: at most 1.5.

    nice -n 10 python -m bench.attributes [--small 10000] [--large 1000000] [--queries 300]
                                          [--db dr_bench_attributes] [--out bench/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import app

DEFAULT_DB = "dr_bench_attributes"
# The search reads one of run_attribute's indexes ((name, value_text) or (value_text)), whichever the planner picks.
INDEX_SCAN = "using run_attribute_"
BUYERS = 1000
LIMIT = 1.5


def execute(alias: str, statement: str, params: list[Any] | None = None) -> None:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(statement, params)


def fill(alias: str, size: int) -> None:
    """`size` runs (finished, attempt-less rows) and their two attributes, in three statements, then ANALYZE."""
    execute(alias, "TRUNCATE run_attribute, run_intervention, run_escalation, run_step, run_state CASCADE")
    # run_state's row triggers (run_count's tally of finished runs) would fire a million times: the search reads
    # neither them nor what they keep, so the fill skips them (and the foreign keys' checks, which the rows meet).
    execute(alias, "SET session_replication_role = replica")
    execute(
        alias,
        "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, ending, "
        "input, priority, queue, created_at, updated_at) SELECT 'po-' || lpad(g::text, 8, '0'), 'bench_noop9', "
        "'fp', 'completed', 9, '', 0, '', '', '{}'::jsonb, 0, 'default', now() - (%s - g) * interval '1 second', "
        "now() FROM generate_series(1, %s) g",
        [size, size],
    )
    execute(
        alias,
        "INSERT INTO run_attribute (run_id, name, value_text, kind) SELECT 'po-' || lpad(g::text, 8, '0'), 'po', "
        "'PO-' || lpad(g::text, 8, '0'), 's' FROM generate_series(1, %s) g",
        [size],
    )
    execute(
        alias,
        "INSERT INTO run_attribute (run_id, name, value_text, kind) SELECT 'po-' || lpad(g::text, 8, '0'), "
        "'buyer', 'buyer-' || (g %% %s), 's' FROM generate_series(1, %s) g",
        [BUYERS, size],
    )
    execute(alias, "SET session_replication_role = DEFAULT")
    execute(alias, "VACUUM ANALYZE run_state")
    execute(alias, "VACUUM ANALYZE run_attribute")


def page(alias: str, pairs: list[tuple[str, str]]) -> Any:
    """The API's queryset for `?attr=...` (a user no scope hides anything from), as its cursor page asks it."""
    from durableruns import services
    from durableruns.api.views import runs_with_attempts

    runs = services.with_attributes(runs_with_attempts().using(alias).newest_first(), pairs)
    return runs.order_by("-created_at", "-run_id")[:51]


def one_search(alias: str, size: int, rng: random.Random) -> tuple[float, float]:
    """(client ms of the page with its prefetches, server execution ms of its statement) for a random po."""
    from django.db import connections

    value = f"PO-{rng.randint(1, size):08d}"
    began = time.perf_counter()
    found = list(page(alias, [("po", value)]))
    client = (time.perf_counter() - began) * 1e3
    if len(found) != 1:
        raise RuntimeError(f"po {value}: {len(found)} runs found, not 1")
    sql, params = page(alias, [("po", value)]).query.sql_with_params()
    with connections[alias].cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        server = float(cursor.fetchone()[0][0]["Execution Time"])
    return client, server


def summary(values: list[float], digits: int) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), digits), "p90": round(ordered[int(len(ordered) * 0.9)], digits)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.attributes", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db",
        default=DEFAULT_DB,
        help=f"the bench's own databases' prefix (default {DEFAULT_DB}: {DEFAULT_DB}_small and {DEFAULT_DB}_large)",
    )
    parser.add_argument("--small", type=int, default=10_000, help="runs in the small database (default 10000)")
    parser.add_argument("--large", type=int, default=1_000_000, help="runs in the large one (default 1000000)")
    parser.add_argument("--queries", type=int, default=300, help="timed searches per size (default 300)")
    parser.add_argument("--out", type=Path, default=None, help="write attributes.json and attributes.md there")
    parser.add_argument("--seed", type=int, default=32)
    args = parser.parse_args(argv)
    from bench.pg import recreate_database

    small_db, large_db = f"{args.db}_small", f"{args.db}_large"
    recreate_database(large_db)  # fresh each time: filled below, under today's migrations
    app.configure(large_db)
    recreate_database(small_db)
    from django.core.management import call_command
    from django.db import connections

    connections.settings["small"] = {**connections.settings["default"], "NAME": small_db}
    call_command("migrate", database="small", verbosity=0, interactive=False)
    sizes = {"small": args.small, "default": args.large}
    fills = {}
    for alias, size in sizes.items():
        began = time.monotonic()
        fill(alias, size)
        fills[alias] = round(time.monotonic() - began, 1)
    rng = random.Random(args.seed)
    samples: dict[str, list[tuple[float, float]]] = {alias: [] for alias in sizes}
    try:
        for alias, size in sizes.items():  # warm: each connection's plans and the index pages it reads
            for _ in range(20):
                one_search(alias, size, rng)
        for n in range(args.queries):  # side by side: the machine's load moves both sizes alike
            for alias in ("small", "default") if n % 2 else ("default", "small"):
                samples[alias].append(one_search(alias, sizes[alias], rng))
        rows = []
        for alias, size in sizes.items():
            value = f"PO-{rng.randint(1, size):08d}"
            plan = page(alias, [("po", value)]).explain()
            both = [("po", value), ("buyer", f"buyer-{int(value[3:]) % BUYERS}")]
            combined = []
            for _ in range(max(10, args.queries // 10)):
                began = time.perf_counter()
                if len(list(page(alias, both))) != 1:
                    raise RuntimeError(f"{both}: not one run")
                combined.append((time.perf_counter() - began) * 1e3)
            rows.append(
                {
                    "runs": size,
                    "queries": len(samples[alias]),
                    "fill_seconds": fills[alias],
                    "client_ms": summary([c for c, _ in samples[alias]], 3),
                    "server_ms": summary([s for _, s in samples[alias]], 4),
                    "po_and_buyer_client_ms_median": round(statistics.median(combined), 3),
                    "uses_index": INDEX_SCAN in plan,
                    "plan": plan,
                }
            )
    finally:
        for alias in sizes:
            execute(alias, "TRUNCATE run_attribute, run_intervention, run_escalation, run_step, run_state CASCADE")
    small, large = rows
    for row in rows:
        print(
            f"{row['runs']:>9,} runs: {row['client_ms']['median']:.3f} ms per page (p90 {row['client_ms']['p90']:.3f}),"
            f" server {row['server_ms']['median']:.4f} ms, an index of run_attribute used: {row['uses_index']}"
        )
    ratio = round(large["client_ms"]["median"] / small["client_ms"]["median"], 3)
    server_ratio = round(large["server_ms"]["median"] / small["server_ms"]["median"], 3)
    result = {
        "command": "nice -n 10 python -m bench.attributes " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg": os.getloadavg(),
        "sizes": rows,
        "ratio": ratio,
        "server_ratio": server_ratio,
        "limit": LIMIT,
        "within_limit": ratio <= LIMIT and all(r["uses_index"] for r in rows),
    }
    print(
        f"{large['runs']:,} over {small['runs']:,} runs: {ratio} x per page from the client, {server_ratio} x on "
        f"the server (limit {LIMIT} x)"
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attributes.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "attributes.md").write_text(report(result))
    return result


def report(result: dict[str, Any]) -> str:
    """The figures as a Markdown table, with the plan of the large size's search."""
    lines = [
        "# Attribute search: `GET /api/runs/?attr=po:<value>`",
        "",
        f"`{result['command']}`, {result['date']}, load average {result['loadavg'][0]:.1f}.",
        "",
        "| runs | client ms per page (median, p90) | server ms (median, p90) | po and buyer, client ms | index |",
        "| ---: | --- | --- | ---: | --- |",
    ]
    for r in result["sizes"]:
        lines.append(
            f"| {r['runs']:,} | {r['client_ms']['median']}, {r['client_ms']['p90']} | "
            f"{r['server_ms']['median']}, {r['server_ms']['p90']} | {r['po_and_buyer_client_ms_median']} | "
            f"{'yes' if r['uses_index'] else 'NO'} |"
        )
    lines += [
        "",
        f"Ratio, largest over smallest size: **{result['ratio']} x** from the client, "
        f"{result['server_ratio']} x on the server (limit {result['limit']} x): "
        f"{'within' if result['within_limit'] else 'NOT within'}.",
        "",
        f"Plan at {result['sizes'][-1]['runs']:,} runs:",
        "",
        "```",
        result["sizes"][-1]["plan"],
        "```",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
