"""The PostgreSQL floor under durable-step bookkeeping, measured with raw psycopg 3.

It times (a) one small committed UPDATE, (b) a durable step's bookkeeping done
by hand as two commits (intent, then result), and (c) the same bookkeeping as a
single fenced statement with data-modifying CTEs, so any framework's per-step
cost can be read against what the database itself needs.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable
from typing import Any, Optional

import psycopg

from bench.pg import Databases, conninfo, ensure_database
from bench.stats import Summary, Workload, measure, ratio, rounded

BENCH_DB = Databases().floor

OWNER = "bench-worker-1"
EPOCH = 1
LEASE = "interval '30 seconds'"

DDL = """
CREATE TABLE IF NOT EXISTS bench_run_state (
    run_id text PRIMARY KEY,
    workflow text,
    status text,
    cursor int,
    owner text,
    epoch int,
    lease_expires_at timestamptz,
    updated_at timestamptz
);
CREATE TABLE IF NOT EXISTS bench_run_step (
    run_id text,
    step text,
    attempt int,
    status text CHECK (status IN ('started', 'completed', 'failed')),
    effect_key text,
    started_at timestamptz,
    finished_at timestamptz,
    result jsonb,
    owner text,
    epoch int,
    PRIMARY KEY (run_id, step, attempt)
);
"""

COMMIT_SQL = "UPDATE bench_run_state SET cursor = cursor + 1, updated_at = now() WHERE run_id = %s"

INTENT_INSERT_SQL = (
    "INSERT INTO bench_run_step (run_id, step, attempt, status, effect_key, started_at, owner, epoch) "
    "VALUES (%s, %s, %s, 'started', %s, now(), %s, %s)"
)
INTENT_FENCE_SQL = (
    f"UPDATE bench_run_state SET updated_at = now(), lease_expires_at = now() + {LEASE} "
    "WHERE run_id = %s AND epoch = %s"
)
RESULT_FENCE_SQL = (
    f"UPDATE bench_run_state SET cursor = %s, updated_at = now(), lease_expires_at = now() + {LEASE} "
    "WHERE run_id = %s AND epoch = %s"
)
RESULT_STEP_SQL = (
    "UPDATE bench_run_step SET status = 'completed', result = %s::jsonb, finished_at = now() "
    "WHERE run_id = %s AND step = %s AND attempt = %s AND status = 'started'"
)

# One statement = one commit: result of step N, cursor move and intent of
# step N+1. Every write hangs off the fenced run_state UPDATE, so a stale epoch
# (no row in `fenced`) writes nothing. done_step / next_step may be NULL for
# the first intent of a run and for its last result.
ONE_STATEMENT_SQL = f"""
WITH fenced AS (
    UPDATE bench_run_state
       SET cursor = %(cursor)s, updated_at = now(), lease_expires_at = now() + {LEASE}
     WHERE run_id = %(run_id)s AND epoch = %(epoch)s
    RETURNING run_id
), done AS (
    UPDATE bench_run_step AS s
       SET status = 'completed', result = %(result)s::jsonb, finished_at = now()
      FROM fenced
     WHERE s.run_id = fenced.run_id AND s.step = %(done_step)s::text
       AND s.attempt = %(done_attempt)s::int AND s.status = 'started'
    RETURNING s.step
), intent AS (
    INSERT INTO bench_run_step (run_id, step, attempt, status, effect_key, started_at, owner, epoch)
    SELECT fenced.run_id, %(next_step)s::text, 1, 'started', %(next_effect_key)s::text, now(),
           %(owner)s, %(epoch)s
      FROM fenced
     WHERE %(next_step)s::text IS NOT NULL
    RETURNING step
)
SELECT (SELECT count(*) FROM fenced), (SELECT count(*) FROM done), (SELECT count(*) FROM intent)
"""


class FencedOut(Exception):
    """A fenced write matched no run_state row: this worker's epoch is stale."""


def connect(dbname: str = BENCH_DB, *, prepared: bool = False) -> psycopg.Connection[Any]:
    """An autocommit connection configured the way Django 5.2's psycopg 3 backend configures one.

    Django uses client-side binding cursors (``ClientCursor``) unless
    ``server_side_binding`` is set, ``prepare_threshold=None`` and sets the
    session time zone to UTC when it differs. With ``prepared``, the settings
    of durableruns' PostgreSQL hot path instead (durableruns.store.sql): server-side
    binding, every statement prepared, plans left to PostgreSQL (reused once a
    generic one does as well).
    """
    ensure_database(dbname)
    if prepared:
        conn = psycopg.connect(conninfo(dbname), autocommit=True, prepare_threshold=0)
    else:
        conn = psycopg.connect(
            conninfo(dbname),
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,
            prepare_threshold=None,
        )
    if conn.info.parameter_status("TimeZone") != "UTC":
        conn.execute("SELECT set_config('TimeZone', %s, false)", ("UTC",))
    return conn


def reset_tables(conn: psycopg.Connection[Any]) -> None:
    """Create the bench tables if needed and empty them."""
    conn.execute(DDL)
    conn.execute("TRUNCATE bench_run_state, bench_run_step")


def new_run_ids(count: int) -> list[str]:
    return [f"run-{uuid.uuid4().hex}" for _ in range(count)]


def create_runs(conn: psycopg.Connection[Any], run_ids: list[str], *, epoch: int = EPOCH) -> list[str]:
    """Insert run_state rows (untimed setup) and return the ids."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO bench_run_state (run_id, workflow, status, cursor, owner, epoch, lease_expires_at, updated_at) "
            f"VALUES (%s, 'bench', 'running', 0, %s, %s, now() + {LEASE}, now())",
            [(run_id, OWNER, epoch) for run_id in run_ids],
        )
    return run_ids


def step_name(index: int) -> str:
    return f"step-{index}"


def effect_key(run_id: str, step: str, attempt: int = 1) -> str:
    return f"{run_id}:{step}:{attempt}"


def result_json(index: int) -> str:
    return json.dumps({"ok": True, "step": index})


# --- (a) one small committed transaction --------------------------------------


def commit_workload(conn: psycopg.Connection[Any], *, commits: int = 200, name: str = "floor_commit") -> Workload:
    """``commits`` autocommitted single-row UPDATEs (one commit each) on a fresh run row."""

    def setup() -> str:
        return create_runs(conn, new_run_ids(1))[0]

    def work(run_id: str) -> None:
        for _ in range(commits):
            cur = conn.execute(COMMIT_SQL, (run_id,))
            if cur.rowcount != 1:
                raise RuntimeError("commit floor UPDATE matched no row")

    return Workload(name=name, run=work, ops=commits, setup=setup)


def measure_commit(*, repeat: int = 10, commits: int = 200, warmup: int = 1, dbname: str = BENCH_DB) -> Summary:
    """Milliseconds per autocommitted single-row UPDATE (one commit each), ``commits`` per repetition."""
    with connect(dbname) as conn:
        reset_tables(conn)
        w = commit_workload(conn, commits=commits)
        return measure(w.run, repeat=repeat, warmup=warmup, ops=w.ops, setup=w.setup)


# --- (b) two commits per step ------------------------------------------------


def two_commit_step(conn: psycopg.Connection[Any], run_id: str, index: int, *, epoch: int = EPOCH) -> None:
    """One step's bookkeeping as two transactions: intent, then result (both fenced on ``epoch``)."""
    step = step_name(index)
    with conn.transaction():
        conn.execute(INTENT_INSERT_SQL, (run_id, step, 1, effect_key(run_id, step), OWNER, epoch))
        if conn.execute(INTENT_FENCE_SQL, (run_id, epoch)).rowcount != 1:
            raise FencedOut(run_id)
    with conn.transaction():
        if conn.execute(RESULT_FENCE_SQL, (index, run_id, epoch)).rowcount != 1:
            raise FencedOut(run_id)
        if conn.execute(RESULT_STEP_SQL, (result_json(index), run_id, step, 1)).rowcount != 1:
            raise RuntimeError(f"step {run_id}/{step} was not in 'started'")


def _runs_workload(conn: psycopg.Connection[Any], *, runs: int, steps: int, name: str,
                   per_run: Callable[[psycopg.Connection[Any], str, int], None]) -> Workload:
    """``runs`` fresh runs (created untimed) whose bookkeeping ``per_run`` does, ``steps`` steps each."""

    def setup() -> list[str]:
        return create_runs(conn, new_run_ids(runs))

    def work(run_ids: list[str]) -> None:
        for run_id in run_ids:
            per_run(conn, run_id, steps)

    return Workload(name=name, run=work, ops=runs * steps, setup=setup)


def _measure_workload(make: Callable[[psycopg.Connection[Any]], Workload], *, repeat: int, warmup: int,
                      dbname: str) -> Summary:
    with connect(dbname) as conn:
        reset_tables(conn)
        w = make(conn)
        return measure(w.run, repeat=repeat, warmup=warmup, ops=w.ops, setup=w.setup)


def two_commit_run(conn: psycopg.Connection[Any], run_id: str, steps: int) -> None:
    """A whole run's bookkeeping with two commits per step."""
    for index in range(1, steps + 1):
        two_commit_step(conn, run_id, index)


def two_commit_workload(conn: psycopg.Connection[Any], *, runs: int = 20, steps: int = 9,
                        name: str = "floor_two_commit_step") -> Workload:
    """``runs`` fresh runs of ``steps`` steps, each step's bookkeeping as two commits."""
    return _runs_workload(conn, runs=runs, steps=steps, name=name, per_run=two_commit_run)


def measure_two_commit_step(
    *, repeat: int = 10, runs: int = 20, steps: int = 9, warmup: int = 1, dbname: str = BENCH_DB
) -> Summary:
    """Milliseconds per step with two commits per step; ``runs`` fresh runs of ``steps`` steps per repetition."""
    return _measure_workload(lambda conn: two_commit_workload(conn, runs=runs, steps=steps), repeat=repeat,
                             warmup=warmup, dbname=dbname)


# --- (c) one statement (one commit) per step -----------------------------------


def one_statement(
    conn: psycopg.Connection[Any],
    run_id: str,
    *,
    cursor: int,
    done_index: Optional[int],
    next_index: Optional[int],
    epoch: int = EPOCH,
) -> tuple[int, int, int]:
    """Run the fenced CTE statement; return row counts (run_state, completed step, new intent)."""
    next_step = step_name(next_index) if next_index is not None else None
    params = {
        "run_id": run_id,
        "epoch": epoch,
        "cursor": cursor,
        "result": result_json(done_index) if done_index is not None else None,
        "done_step": step_name(done_index) if done_index is not None else None,
        "done_attempt": 1,
        "next_step": next_step,
        "next_effect_key": effect_key(run_id, next_step) if next_step is not None else None,
        "owner": OWNER,
    }
    row = conn.execute(ONE_STATEMENT_SQL, params).fetchone()
    if row is None:
        raise RuntimeError("CTE statement returned no row")
    return int(row[0]), int(row[1]), int(row[2])


def one_statement_run(conn: psycopg.Connection[Any], run_id: str, steps: int, *, epoch: int = EPOCH) -> None:
    """A whole run's bookkeeping: the first intent, then one statement per step (``steps + 1`` commits)."""
    expected = (1, 0, 1)
    if one_statement(conn, run_id, cursor=0, done_index=None, next_index=1, epoch=epoch) != expected:
        raise FencedOut(run_id)
    for index in range(1, steps + 1):
        next_index = index + 1 if index < steps else None
        expected = (1, 1, 1 if next_index is not None else 0)
        got = one_statement(conn, run_id, cursor=index, done_index=index, next_index=next_index, epoch=epoch)
        if got != expected:
            if got[0] == 0:
                raise FencedOut(run_id)
            raise RuntimeError(f"unexpected row counts {got} for {run_id} step {index}")


def one_statement_workload(conn: psycopg.Connection[Any], *, runs: int = 20, steps: int = 9,
                           name: str = "floor_one_statement_step") -> Workload:
    """``runs`` fresh runs of ``steps`` steps, one fenced statement per step plus each run's first intent."""
    return _runs_workload(conn, runs=runs, steps=steps, name=name,
                          per_run=lambda c, run_id, n: one_statement_run(c, run_id, n))


def measure_one_statement_step(
    *, repeat: int = 10, runs: int = 20, steps: int = 9, warmup: int = 1, dbname: str = BENCH_DB
) -> Summary:
    """Milliseconds per step with one fenced statement per step (plus each run's first intent, included)."""
    return _measure_workload(lambda conn: one_statement_workload(conn, runs=runs, steps=steps), repeat=repeat,
                             warmup=warmup, dbname=dbname)


# --- self-check ----------------------------------------------------------------


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _snapshot(conn: psycopg.Connection[Any], run_id: str) -> tuple[Any, list[Any]]:
    state = conn.execute(
        "SELECT cursor, epoch, lease_expires_at, updated_at FROM bench_run_state WHERE run_id = %s", (run_id,)
    ).fetchone()
    steps = conn.execute(
        "SELECT step, attempt, status, result, finished_at FROM bench_run_step WHERE run_id = %s ORDER BY step, attempt",
        (run_id,),
    ).fetchall()
    return state, steps


def selfcheck(dbname: str = BENCH_DB) -> dict[str, float]:
    """Check both bookkeeping paths write what they should and that a stale epoch writes nothing.

    Raises AssertionError on failure; returns the number of checks passed.
    """
    checks = 0
    with connect(dbname) as conn:
        conn.execute(DDL)
        run_id = create_runs(conn, new_run_ids(1), epoch=2)[0]
        try:
            # First intent under the current epoch.
            got = one_statement(conn, run_id, cursor=0, done_index=None, next_index=1, epoch=2)
            _check(got == (1, 0, 1), f"first intent wrote {got}")
            checks += 1
            before = _snapshot(conn, run_id)

            # A stale epoch (1 < 2) must write nothing at all.
            got = one_statement(conn, run_id, cursor=1, done_index=1, next_index=2, epoch=1)
            _check(got == (0, 0, 0), f"stale epoch wrote {got}")
            checks += 1
            _check(_snapshot(conn, run_id) == before, "stale epoch changed run_state or run_step")
            checks += 1

            # The current epoch completes step 1, moves the cursor and records intent for step 2.
            got = one_statement(conn, run_id, cursor=1, done_index=1, next_index=2, epoch=2)
            _check(got == (1, 1, 1), f"current epoch wrote {got}")
            checks += 1
            state, steps = _snapshot(conn, run_id)
            _check(state is not None and state[0] == 1, f"cursor is {state}")
            _check(
                [(s[0], s[2]) for s in steps] == [("step-1", "completed"), ("step-2", "started")],
                f"steps are {steps}",
            )
            _check(steps[0][3] == {"ok": True, "step": 1}, f"result is {steps[0][3]}")
            checks += 3

            # Replaying the same statement is a no-op for the step (already completed) and
            # conflicts on the intent's primary key, so the whole statement rolls back.
            before = _snapshot(conn, run_id)
            try:
                one_statement(conn, run_id, cursor=1, done_index=1, next_index=2, epoch=2)
                _check(False, "duplicate intent was accepted")
            except psycopg.errors.UniqueViolation:
                pass
            _check(_snapshot(conn, run_id) == before, "failed statement left partial writes")
            checks += 2

            # The two-commit path: a stale epoch raises and its intent insert is rolled back.
            try:
                two_commit_step(conn, run_id, 7, epoch=1)
                _check(False, "two-commit step accepted a stale epoch")
            except FencedOut:
                pass
            _check(_snapshot(conn, run_id) == before, "stale two-commit intent left writes")
            checks += 2

            # And under the current epoch it completes the step.
            two_commit_step(conn, run_id, 7, epoch=2)
            state, steps = _snapshot(conn, run_id)
            _check(state is not None and state[0] == 7, f"cursor after two-commit step is {state}")
            _check(("step-7", "completed") in [(s[0], s[2]) for s in steps], f"steps are {steps}")
            checks += 2
        finally:
            conn.execute("DELETE FROM bench_run_step WHERE run_id = %s", (run_id,))
            conn.execute("DELETE FROM bench_run_state WHERE run_id = %s", (run_id,))
    return {"checks_passed": float(checks)}


def run_all(*, repeat: int = 10, commits: int = 200, runs: int = 20, steps: int = 9) -> dict[str, Any]:
    """All three floor measurements plus ratios, in one dict."""
    commit = measure_commit(repeat=repeat, commits=commits)
    two = measure_two_commit_step(repeat=repeat, runs=runs, steps=steps)
    one = measure_one_statement_step(repeat=repeat, runs=runs, steps=steps)
    return {
        "ms_per_commit": commit,
        "ms_per_step_two_commits": two,
        "ms_per_step_one_statement": one,
        "two_commit_over_one_statement": ratio(two, one),
        "two_commit_over_commit": ratio(two, commit),
        "params": {
            "repeat": repeat,
            "commits_per_rep": commits,
            "runs_per_rep": runs,
            "steps_per_run": steps,
            "commits_per_step_two_commits": 2.0,
            "commits_per_step_one_statement": (steps + 1) / steps,
        },
    }


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--commits", type=int, default=200, help="commits per repetition for (a)")
    parser.add_argument("--runs", type=int, default=20, help="fresh runs per repetition for (b) and (c)")
    parser.add_argument("--steps", type=int, default=9, help="steps per run for (b) and (c)")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"selfcheck": selfcheck()}
    result.update(run_all(repeat=args.repeat, commits=args.commits, runs=args.runs, steps=args.steps))
    print(json.dumps(rounded(result), indent=2))


if __name__ == "__main__":
    main()
