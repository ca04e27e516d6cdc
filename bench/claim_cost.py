"""Claim cost against table size: claiming the next due run must not slow down as finished runs pile up.

Each level is a schema (``claims_<N>``) holding copies of the migrated run_state and run_step tables (same
columns, check constraints and indexes, the latter re-created from pg_get_indexdef under the same names), with
N completed runs and one completed attempt each, generated once in SQL with generate_series and reused by
later runs (checked by count and by a signature of the public tables' definitions). Each round then
records a few hundred pending runs and times store.claim, the engine's own claim (one UPDATE ... WHERE run_id =
(SELECT ... FOR UPDATE SKIP LOCKED)), with Django's connection pointed at the level's schema. The plan of
that exact statement, as the engine sent it, is shown with EXPLAIN: the partial index run_state_ready_idx
holds only runs a worker may still take, so the finished ones are never read.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench import app
from bench.stats import Workload, interleave, ratio
from bench.workflows import NOOP_STEPS, noop9
from durableruns import store

TABLES = ("run_state", "run_step")
INDEX = "run_state_ready_idx"  # the claim's probe of ready runs (pending, or abandoned)
OWNER = "bench-claimer"
ACTIVE = "status IN ('pending', 'running', 'waiting')"  # the partial index's predicate: deletes stay cheap too


def schema_name(finished: int) -> str:
    return f"claims_{finished}"


def _definitions() -> tuple[list[str], str]:
    """The public tables' index definitions, and a signature of those and of their columns."""
    indexes = [row[0] for row in app.execute(
        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relname = ANY(%s) "
        "ORDER BY 1", [list(TABLES)])]
    columns = app.execute(
        "SELECT table_name, column_name, data_type, column_default FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name = ANY(%s) ORDER BY 1, 2", [list(TABLES)])
    signature = hashlib.sha256(repr((indexes, columns)).encode()).hexdigest()[:16]
    return indexes, signature


def _ready(schema: str, finished: int, signature: str) -> bool:
    row = app.execute("SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
                      [schema])
    if not row or row[0][0] != signature:
        return False
    counts = app.execute(f"SELECT (SELECT count(*) FROM {schema}.run_state WHERE status = 'completed'), "
                         f"(SELECT count(*) FROM {schema}.run_step)")
    return counts[0] == (finished, finished)


def prepare(finished: int) -> dict[str, Any]:
    """Make sure schema claims_<finished> holds ``finished`` completed runs; generate them only if not."""
    schema = schema_name(finished)
    indexes, signature = _definitions()
    if _ready(schema, finished, signature):
        return {"schema": schema, "generated": False, "generation_s": 0.0}
    began = time.perf_counter()
    app.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    app.execute(f"CREATE SCHEMA {schema}")
    for table in TABLES:
        app.execute(f"CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    last = NOOP_STEPS
    app.execute(
        f"INSERT INTO {schema}.run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
        "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
        "SELECT 'done-' || g, %s, %s, 'completed', %s, 'bench', 1, NULL, NULL, '', '{}'::jsonb, "
        "now() - interval '1 day' + g * interval '1 millisecond', now() FROM generate_series(1, %s) g",
        [noop9.name, noop9.fingerprint, last, finished])
    app.execute(
        f"INSERT INTO {schema}.run_step (run_id, step, attempt, status, effect_key, started_at, finished_at, "
        "result, error, resolution, owner, epoch, loop_cursor, progress) "
        "SELECT 'done-' || g, %s, 1, 'completed', 'done-' || g || ':' || %s, now(), now(), 'null'::jsonb, '', "
        "'returned', 'bench', 1, 0, '{}'::jsonb FROM generate_series(1, %s) g",
        [noop9.plan[-1], noop9.plan[-1], finished])
    for definition in indexes:  # after the rows: building an index once is cheaper than maintaining it
        app.execute(definition.replace(" ON public.", f" ON {schema}.", 1))
    for table in TABLES:
        app.execute(f"VACUUM ANALYZE {schema}.{table}")
    app.execute(f"COMMENT ON SCHEMA {schema} IS '{signature}'")
    return {"schema": schema, "generated": True, "generation_s": time.perf_counter() - began}


@contextmanager
def search_path(schema: str) -> Iterator[None]:
    """Point Django's connection (hence the engine's unqualified run_state) at ``schema``."""
    app.execute(f"SET search_path TO {schema}")
    try:
        yield
    finally:
        app.execute("SET search_path TO DEFAULT")


def refill(schema: str, pending: int) -> None:
    """Drop the level's claimed and pending runs and record ``pending`` new pending ones."""
    app.execute(f"DELETE FROM {schema}.run_state WHERE {ACTIVE}")
    app.execute(
        f"INSERT INTO {schema}.run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
        "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
        "SELECT 'due-' || md5(random()::text) || g, %s, %s, 'pending', 0, '', 0, NULL, NULL, '', '{}'::jsonb, "
        "now() + g * interval '1 microsecond', now() FROM generate_series(1, %s) g",
        [noop9.name, noop9.fingerprint, pending])


def claim_workload(finished: int, claims: int) -> Workload:
    """``claims`` claims of the engine (store.claim) against the level with ``finished`` completed runs."""
    schema = schema_name(finished)

    def setup() -> None:
        refill(schema, claims)
        app.execute(f"SET search_path TO {schema}")

    def work(_prepared: None) -> None:
        try:
            for _ in range(claims):
                if store.claim(owner=OWNER, lease_seconds=30) is None:
                    raise RuntimeError(f"{schema}: nothing to claim")
        finally:
            app.execute("SET search_path TO DEFAULT")

    return Workload(name=schema, run=work, ops=claims, setup=setup)


def explain(finished: int) -> dict[str, Any]:
    """EXPLAIN of the claim statement exactly as the engine sent it, at this level."""
    schema = schema_name(finished)
    refill(schema, 1)
    with search_path(schema):
        with CaptureQueriesContext(connection) as captured:
            store.claim(owner=OWNER, lease_seconds=30)
        statement = captured.captured_queries[-1]["sql"]
        # the claim's SET LOCAL, then its statement (whose own text may hold ";\n", in a comment)
        planning, _, update = statement.partition(";\n") if statement.startswith("SET LOCAL") else ("", "", statement)
        with connection.cursor() as cursor:
            cursor.execute(f"{planning};\nEXPLAIN {update}" if planning else f"EXPLAIN {update}")
            if planning:
                cursor.nextset()
            plan = [row[0] for row in cursor.fetchall()]
    return {"queries_per_claim": len(captured.captured_queries), "plan": plan,
            "uses_active_index": any(INDEX in line for line in plan)}


def measure(*, levels: tuple[int, ...], claims: int, repeat: int) -> dict[str, Any]:
    """Figure 5: ms per claim at each level (rounds rotating between levels), the plan, and the ratio to 0."""
    generation = {str(n): prepare(n) for n in levels}
    ms = interleave([claim_workload(n, claims) for n in levels], repeat=repeat)
    figures: dict[str, Any] = {}
    for n in levels:
        figures[str(n)] = {"ms_per_claim": ms[schema_name(n)], "explain": explain(n), **generation[str(n)]}
        app.execute(f"DELETE FROM {schema_name(n)}.run_state WHERE {ACTIVE}")
    base, top = ms[schema_name(levels[0])], ms[schema_name(levels[-1])]
    return {
        "levels": figures,
        "largest_over_empty": ratio(top, base),
        "params": {"finished_runs": list(levels), "pending_per_round": claims, "rounds": repeat,
                   "finished_rows": "one completed run_state row and one completed run_step row per finished run",
                   "claim": "durableruns.store.claim (the engine's one-statement claim on PostgreSQL)"},
    }
