"""Runs that wait, measured on PostgreSQL with an idle listening `resume_runs --loop` worker (bench.settings).

- event: runs wait at a wait_for; the runner sends each its event one at a time (random gaps). Latency: the
  wait's completion (its run_step.finished_at) minus the event's sent_at, both the database's clock.
- sleep: runs sleep a random few hundred ms; latency: the next step's intent (its started_at) minus the wake
  time the sleep recorded, both the database's clock. The worker's timer wakes for the earliest wake_at.
- claim cost: store.claim with 100,000 runs sleeping (waiting, wake_at a day ahead, all older than the due runs)
  against none, in schemas as bench/claim_cost.py builds them.

Run: `python -m bench.waits [--runs N] [--rounds R] [--out bench/results/waits.json]` (its own databases,
dr_waits_bench by default).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

SLEEPING = 100_000


def _wait_for(query: str, params: list[Any], expected: int, *, what: str, timeout: float = 120.0) -> None:
    from bench import app

    deadline = time.monotonic() + timeout
    while app.execute(query, params)[0][0] < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not in time")
        time.sleep(0.05)


def event_round(dbname: str, *, runs: int, rng: random.Random) -> list[float]:
    import durableruns
    from bench import app
    from bench.workflows import wait_event

    app.reset()
    worker = app.LoopWorker(dbname, "--loop", "--lease", "30", env_extra={"DJANGO_SETTINGS_MODULE": "bench.settings"})
    try:
        if "listening" not in worker.first_line():
            raise RuntimeError("the worker is not listening")
        ids = [durableruns.start(wait_event.name, {}) for _ in range(runs)]
        _wait_for("SELECT count(*) FROM run_state WHERE status = 'waiting'", [], runs, what="the waits begin")
        time.sleep(0.5)  # the worker idle again
        for run_id in ids:
            time.sleep(rng.uniform(0.02, 0.2))
            durableruns.send(run_id, "go", {"n": 1})
        _wait_for("SELECT count(*) FROM run_state WHERE status = 'completed'", [], runs, what="the waits complete")
    finally:
        worker.stop()
    rows = app.execute("SELECT e.sent_at, s.finished_at FROM run_event e JOIN run_step s ON s.run_id = e.run_id "
                       "AND s.step = 'go' AND s.status = 'completed'")
    return [1000 * (finished - sent).total_seconds() for sent, finished in rows]


def sleep_round(dbname: str, *, runs: int, rng: random.Random) -> list[float]:
    import durableruns
    from bench import app
    from bench.workflows import sleep_then

    app.reset()
    worker = app.LoopWorker(dbname, "--loop", "--lease", "30", env_extra={"DJANGO_SETTINGS_MODULE": "bench.settings"})
    try:
        if "listening" not in worker.first_line():
            raise RuntimeError("the worker is not listening")
        for _ in range(runs):
            time.sleep(rng.uniform(0.02, 0.1))
            durableruns.start(sleep_then.name, {"ms": rng.uniform(300, 1500)})
        _wait_for("SELECT count(*) FROM run_state WHERE status = 'completed'", [], runs, what="the sleeps end")
    finally:
        worker.stop()
    rows = app.execute("SELECT (n.progress->>'until')::timestamptz, a.started_at FROM run_step n JOIN run_step a "
                       "ON a.run_id = n.run_id AND a.step = 'after_nap' AND a.attempt = 1 WHERE n.step = 'nap'")
    return [1000 * (started - until).total_seconds() for until, started in rows]


def prepare_sleeping(n: int) -> str:
    """Schema claims_sleeping_<n>: run_state and run_step as claim_cost builds them, with ``n`` waiting runs."""
    from bench import app, claim_cost
    from bench.workflows import sleep_then

    schema = f"claims_sleeping_{n}"
    indexes, signature = claim_cost._definitions()
    app.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    app.execute(f"CREATE SCHEMA {schema}")
    for table in claim_cost.TABLES:
        app.execute(f"CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    app.execute(
        f"INSERT INTO {schema}.run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
        "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
        "SELECT 'asleep-' || g, %s, %s, 'waiting', 0, '', 1, NULL, now() + interval '1 day', 'nap: sleeping', "
        "'{}'::jsonb, now() - interval '1 day' + g * interval '1 millisecond', now() FROM generate_series(1, %s) g",
        [sleep_then.name, sleep_then.fingerprint, n])
    app.execute(
        f"INSERT INTO {schema}.run_step (run_id, step, attempt, status, effect_key, started_at, finished_at, "
        "result, error, resolution, owner, epoch, loop_cursor, progress) "
        "SELECT 'asleep-' || g, 'nap', 1, 'started', 'asleep-' || g || ':nap', now(), NULL, NULL, '', '', "
        "'bench', 1, 0, jsonb_build_object('until', now() + interval '1 day', 'kind', 'sleep') "
        "FROM generate_series(1, %s) g", [n])
    for definition in indexes:
        app.execute(definition.replace(" ON public.", f" ON {schema}.", 1))
    for table in claim_cost.TABLES:
        app.execute(f"VACUUM ANALYZE {schema}.{table}")
    app.execute(f"COMMENT ON SCHEMA {schema} IS '{signature}'")
    return schema


def claim_cost_figure(*, claims: int, repeat: int) -> dict[str, Any]:
    from bench import app, claim_cost
    from bench.stats import Workload, interleave, ratio
    from durableruns import store

    claim_cost.prepare(0)
    asleep = prepare_sleeping(SLEEPING)

    def workload(schema: str) -> Workload:
        def setup() -> None:
            claim_cost.refill(schema, claims)
            app.execute(f"SET search_path TO {schema}")

        def work(_prepared: None) -> None:
            try:
                for _ in range(claims):
                    if store.claim(owner=claim_cost.OWNER, lease_seconds=30) is None:
                        raise RuntimeError(f"{schema}: nothing to claim")
            finally:
                app.execute("SET search_path TO DEFAULT")

        return Workload(name=schema, run=work, ops=claims, setup=setup)

    # claim_cost.refill deletes every active run (the sleeping ones too): this level refills its own way
    ms = interleave([workload("claims_0"), _sleeping_workload(asleep, claims)], repeat=repeat)
    return {"ms_per_claim": {"none_sleeping": ms["claims_0"], f"{SLEEPING}_sleeping": ms[asleep]},
            "sleeping_over_none": ratio(ms[asleep], ms["claims_0"]),
            "params": {"claims_per_round": claims, "rounds": repeat, "sleeping": SLEEPING,
                       "sleeping_rows": "waiting, wake_at a day ahead, created before the due runs; each with "
                                        "its begun sleep attempt"}}


def _sleeping_workload(schema: str, claims: int) -> Any:
    from bench import app, claim_cost
    from bench.stats import Workload
    from bench.workflows import noop9
    from durableruns import store

    def setup() -> None:
        app.execute(f"DELETE FROM {schema}.run_state WHERE status IN ('pending', 'running')")
        app.execute(
            f"INSERT INTO {schema}.run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
            "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
            "SELECT 'due-' || md5(random()::text) || g, %s, %s, 'pending', 0, '', 0, NULL, NULL, '', '{}'::jsonb, "
            "now() + g * interval '1 microsecond', now() FROM generate_series(1, %s) g",
            [noop9.name, noop9.fingerprint, claims])
        app.execute(f"SET search_path TO {schema}")

    def work(_prepared: None) -> None:
        try:
            for _ in range(claims):
                if store.claim(owner=claim_cost.OWNER, lease_seconds=30) is None:
                    raise RuntimeError(f"{schema}: nothing to claim")
        finally:
            app.execute("SET search_path TO DEFAULT")

    return Workload(name=schema, run=work, ops=claims, setup=setup)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default="dr_waits_bench")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--only", default="event,sleep,claim_cost")
    parser.add_argument("--out", type=Path, default=Path("bench/results/waits.json"))
    args = parser.parse_args(argv)
    from bench import app
    from bench.stats import percentile

    app.configure(args.db)
    import bench.workflows  # noqa: F401  (registers the bench workflows in this process)

    rng = random.Random(22)
    only = set(args.only.split(","))
    figures: dict[str, Any] = {"command": " ".join(["python -m bench.waits", *(argv or sys.argv[1:])])}

    def pct(samples: list[float]) -> dict[str, float]:
        return {q: round(percentile(samples, float(q[1:])), 2) for q in ("p50", "p90", "p99")} | {
            "max": round(max(samples), 2), "n": len(samples)}

    if "event" in only:
        samples = [s for _ in range(args.rounds) for s in event_round(args.db, runs=args.runs, rng=rng)]
        figures["event_to_wait_completion_ms"] = pct(samples) | {"target": "p50 <= 10, p99 <= 50"}
    if "sleep" in only:
        samples = [s for _ in range(args.rounds) for s in sleep_round(args.db, runs=args.runs, rng=rng)]
        figures["sleep_end_to_next_intent_ms"] = pct(samples) | {"target": "p99 <= 50"}
    if "claim_cost" in only:
        figures["claim_cost"] = claim_cost_figure(claims=args.claims, repeat=max(3, args.rounds))
    app.reset()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
