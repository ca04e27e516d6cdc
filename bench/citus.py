"""One node against a Citus cluster (a coordinator and two workers), side by side in one run, on this machine.

Each layout is started fresh for each figure (tests/citus/cluster.py: private PostgreSQL 15 servers on loopback
ports, fsync on, synchronous_commit on, so a commit is a flush as in production), migrated, and on the cluster
laid out with `manage.py distribute_runs`. The figures:

1. Steps/s of the same load: RUNS runs of nine no-op steps (bench.workflows.noop9), drained by WORKERS
   `resume_runs --once --concurrency THREADS` processes started together; the commits each node made meanwhile
   (pg_stat_database.xact_commit of its database; on the cluster the coordinator's count holds the commits it
   relays as well as its own).
2. The claim's cost with FINISHED finished runs in the record, for each number given (a fresh layout each;
   completed runs, their attempts not needed: the claim reads run_state only): the median of CLAIMS claims, each
   taking one of as many pending runs, timed in this process through durableruns.store.claim.
3. What a deploy with a concurrency limit pays per claim: on a fresh layout, the median of CLAIMS claims timed in a
   process whose deploy declares no limit (taking runs of the bench workflow), then in one whose deploy declares a
   limited workflow (bench.limited_workflows: one run per key, each run a key of its own, so every claim is
   admitted after its key's lock and count; on the cluster, also the read of the full keys across the shards).
4. distribute_runs on a record that already holds DISTRIBUTE runs (completed, with nine attempts each): how long
   the layout took (what a site with data pays once).

    python -m bench.citus [--runs 300] [--workers 2] [--threads 8] [--finished 10000 1000000] [--claims 200]
                          [--distribute 100000] [--out bench/results]

Needs Citus installed for the server (`bin/setup --citus`). The published figures are in bench/results/citus.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.citus.cluster import DATABASE, SETTINGS, Node, citus_cluster, single_node  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results"
# Production-like commits: each one flushed (the cluster helper's test settings turn both off).
DURABLE = SETTINGS.replace("fsync = off", "fsync = on").replace("synchronous_commit = off", "synchronous_commit = on")
WORKFLOW = "bench_noop9"
STEPS = 9


def site_env(url: str, modules: str = "bench.workflows") -> dict[str, str]:
    return dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="project.settings",
                DURABLERUNS_WORKFLOW_MODULES=modules, PYTHONUNBUFFERED="1")


def manage(url: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=site_env(url), capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


@contextmanager
def layout(kind: str) -> Iterator[tuple[str, tuple[Node, ...]]]:
    """A migrated record: on one node, or on a cluster laid out by distribute_runs; (url, every node)."""
    if kind == "one node":
        with single_node(DURABLE) as node:
            manage(node.url, "migrate", "--skip-checks", "-v0")
            yield node.url, (node,)
    else:
        with citus_cluster(settings=DURABLE) as cluster:
            manage(cluster.url, "migrate", "--skip-checks", "-v0")
            manage(cluster.url, "distribute_runs", "--skip-checks")
            yield cluster.url, cluster.nodes


def commits(nodes: tuple[Node, ...]) -> list[int]:
    return [int(n.query("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0][0])
            for n in nodes]


def start_runs(url: str, count: int, prefix: str) -> None:
    """Start `count` runs of the bench workflow through durableruns.start, in a process of the site's."""
    code = ("import django; django.setup(); import durableruns, bench.workflows\n"
            f"for i in range({count}): durableruns.start({WORKFLOW!r}, {{}}, run_id=f'{prefix}-{{i}}')")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=site_env(url), check=True, timeout=600)


def throughput(kind: str, runs: int, workers: int, threads: int) -> dict[str, Any]:
    with layout(kind) as (url, nodes):
        start_runs(url, runs, "load")
        time.sleep(1.0)  # the statistics collector publishes the starts' commits
        before = commits(nodes)
        began = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "manage.py", "resume_runs", "--skip-checks", "--once",
                                   "--concurrency", str(threads)], cwd=ROOT, env=site_env(url),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(workers)]
        errors = [p.communicate(timeout=1800)[1] for p in procs]
        seconds = time.perf_counter() - began
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError("\n".join(e[-2000:] for e in errors))
        time.sleep(1.0)
        after = commits(nodes)
        done = int(nodes[0].query("SELECT count(*) FROM run_state WHERE status = 'completed'")[0][0])
        if done != runs:
            raise RuntimeError(f"{kind}: {done} of {runs} runs completed")
        names = ["node"] if len(nodes) == 1 else ["coordinator"] + [f"worker {i}" for i in range(1, len(nodes))]
        return {"layout": kind, "runs": runs, "steps": runs * STEPS, "seconds": round(seconds, 2),
                "steps_per_s": round(runs * STEPS / seconds, 1),
                "commits": {name: a - b for name, a, b in zip(names, after, before, strict=True)}}


_CLAIMS = """
import statistics, sys, time
import django; django.setup()
import bench.workflows
from durableruns import store
from durableruns.registry import get_workflow
owner, claims = "bench-citus", int(sys.argv[1])
store.claim(owner=owner, lease_seconds=300)  # the connection and its first plans
times = []
for _ in range(claims):
    began = time.perf_counter()
    taken = store.claim(owner=owner, lease_seconds=300)
    times.append((time.perf_counter() - began) * 1000)
    assert taken is not None
print(statistics.median(times), sorted(times)[int(len(times) * 0.99) - 1])
"""

# Finished runs written straight into run_state (the claim reads nothing else): completed, created over a year.
_FILL = """INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, input,
       priority, queue, ending, created_at, updated_at)
SELECT 'done-' || g, %s, %s, 'completed', 9, '', 1, '', '{}'::jsonb, 0, 'default', '',
       now() - interval '365 days' + g * interval '1 second', now()
  FROM generate_series(1, %s) AS g"""


def fill(node: Node, fingerprint: str, finished: int) -> None:
    """Write `finished` completed runs in one statement. Where run_state counts its finished runs by trigger (one
    node), the triggers are off for the fill's session (a per-row upsert made a 100,000-run fill take minutes) and
    run_count is then brought up to date by migration 0018's own seed statement, so the record is as the triggers
    would have left it. The cluster has no such trigger (distribute_runs drops them)."""
    counted = node.query("SELECT 1 FROM pg_trigger WHERE tgname = 'run_state_count_insert'")
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{node.port}/{DATABASE}", autocommit=True) as conn:
        if counted:
            conn.execute("SET session_replication_role = replica")
        conn.execute(_FILL, [WORKFLOW, fingerprint, finished])  # type: ignore[arg-type]
        if counted:
            conn.execute("SET session_replication_role = DEFAULT")
            seed = importlib.import_module("durableruns.migrations.0018_run_count").POSTGRES_SEED
            conn.execute(seed)
            cur = conn.execute("SELECT (SELECT count(*) FROM run_state WHERE status = 'completed'),"
                               " (SELECT sum(present) FROM run_count WHERE status = 'completed')")
            present, counted_ = cur.fetchone() or (None, None)
            if present != counted_:
                raise RuntimeError(f"run_count says {counted_} completed runs, run_state holds {present}")
        conn.execute("ANALYZE run_state")


def claim_cost(kind: str, finished: int, claims: int) -> dict[str, Any]:
    with layout(kind) as (url, nodes):
        start_runs(url, claims + 1, "due")
        fingerprint = nodes[0].query("SELECT plan_fingerprint FROM run_state LIMIT 1")[0][0]
        began = time.perf_counter()
        fill(nodes[0], fingerprint, finished)
        filled = time.perf_counter() - began
        out = subprocess.run([sys.executable, "-c", _CLAIMS, str(claims)], cwd=ROOT, env=site_env(url),
                             capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        median, p99 = (float(x) for x in out.stdout.split())
        return {"layout": kind, "finished_runs": finished, "claims": claims, "median_ms": round(median, 2),
                "p99_ms": round(p99, 2), "fill_seconds": round(filled, 1)}


LIMITED_MODULES = "bench.workflows,bench.limited_workflows"


def timed_claims(url: str, claims: int, modules: str) -> tuple[float, float]:
    """(median, p99) ms of `claims` claims in a process of the site whose deploy imports `modules`."""
    out = subprocess.run([sys.executable, "-c", _CLAIMS, str(claims)], cwd=ROOT, env=site_env(url, modules),
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    median, p99 = (float(x) for x in out.stdout.split())
    return median, p99


def limited_claim_cost(kind: str, claims: int) -> dict[str, Any]:
    """The claim in a deploy without limits, then in one with a limited workflow, on one fresh layout."""
    with layout(kind) as (url, _nodes):
        start_runs(url, claims + 1, "free")
        plain = timed_claims(url, claims, "bench.workflows")
        code = ("import django; django.setup(); import durableruns\n"
                f"for i in range({claims + 1}): durableruns.start('bench_limited', {{'key': f'k{{i}}'}}, "
                "run_id=f'limited-{i}')")
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=site_env(url, LIMITED_MODULES), check=True,
                       timeout=600)
        limited = timed_claims(url, claims, LIMITED_MODULES)
        return {"layout": kind, "claims": claims, "no_limits_median_ms": round(plain[0], 2),
                "no_limits_p99_ms": round(plain[1], 2), "limited_median_ms": round(limited[0], 2),
                "limited_p99_ms": round(limited[1], 2), "ratio": round(limited[0] / plain[0], 2)}


def distribute_time(runs: int) -> dict[str, Any]:
    """distribute_runs on a cluster whose record already holds `runs` completed runs with nine attempts each."""
    with citus_cluster(settings=DURABLE) as cluster:
        url = cluster.url
        manage(url, "migrate", "--skip-checks", "-v0")
        start_runs(url, 1, "plan")
        node = cluster.coordinator
        fingerprint = node.query("SELECT plan_fingerprint FROM run_state LIMIT 1")[0][0]
        node.query(_FILL, [WORKFLOW, fingerprint, runs])
        node.query("""INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, finished_at, result,
                      error, resolution, owner, epoch, loop_cursor, progress, error_detail)
                      SELECT r.run_id, 'step_' || s, 1, 'completed', r.run_id || ':step_' || s, r.created_at,
                             r.created_at, 'null'::jsonb, '', '', '', 1, 0, '{}'::jsonb, ''
                        FROM run_state r, generate_series(1, 9) AS s WHERE r.run_id LIKE 'done-%%'""")
        began = time.perf_counter()
        out = manage(url, "distribute_runs", "--skip-checks")
        seconds = time.perf_counter() - began
        shards = node.query("SELECT count(*) FROM run_state")[0][0]
        return {"runs": runs, "attempts": runs * STEPS, "seconds": round(seconds, 1), "runs_after": int(shards),
                "output": out.strip().splitlines()[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--finished", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--distribute", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"throughput": [], "claim": [], "limited_claim": [], "distribute": None}
    for kind in ("one node", "cluster"):
        results["throughput"].append(throughput(kind, args.runs, args.workers, args.threads))
        print(json.dumps(results["throughput"][-1]), flush=True)
    for finished in args.finished:
        for kind in ("one node", "cluster"):
            results["claim"].append(claim_cost(kind, finished, args.claims))
            print(json.dumps(results["claim"][-1]), flush=True)
    for kind in ("one node", "cluster"):
        results["limited_claim"].append(limited_claim_cost(kind, args.claims))
        print(json.dumps(results["limited_claim"][-1]), flush=True)
    if args.distribute:
        results["distribute"] = distribute_time(args.distribute)
        print(json.dumps(results["distribute"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "citus.json").write_text(json.dumps(results, indent=2) + "\n")
    ratio = results["throughput"][1]["steps_per_s"] / results["throughput"][0]["steps_per_s"]
    print(f"cluster / one node, steps/s: {ratio:.2f}")
    for row in results["claim"]:
        print(f"claim median ms with {row['finished_runs']} finished runs: {row['median_ms']} ({row['layout']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
