"""The PostgreSQL hot path: its statements (a new run, the fenced facts) are prepared, reuse their plans, are
prepared anew every REPLAN_EVERY executions, and can be turned off. A fresh run's first intent rides on its claim.

Preparing anew matters: a plan cached while the tables are small scans them sequentially, however much they grow
afterwards, for as long as the statement lives.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import durableruns
from durableruns import services, store
from durableruns.engine import Engine
from durableruns.models import RunState, RunStatus, RunStep
from durableruns.registry import effect_key, first_steps
from durableruns.store import Intent, claims, sql
from tests.conftest import CITUS_LANE
from tests.factories import crash_after_intent

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        CITUS_LANE,
        reason="counts the single-node one-statement path's statements, which a distributed record does not use",
    ),
]


def prepared_statements() -> dict[str, tuple[int, int]]:
    """This session's prepared statements: text -> (generic plans, custom plans) so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return {" ".join(text.split()): (generic, custom) for text, generic, custom in cursor.fetchall()}


def run_to_completion(count: int) -> list[str]:
    run_ids = [durableruns.start("scripted", {}) for _ in range(count)]
    report = services.resume_due(limit=count)
    assert [o.status for o in report.outcomes] == [RunStatus.COMPLETED] * count
    return run_ids


def result_with_intent_plan(generation: int) -> str:
    """The plan this session executes for "result of step N + intent of step N+1" of a plan generation."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, cardinality(parameter_types) FROM pg_prepared_statements"
                       " WHERE statement LIKE '%%intent AS (%%' AND statement LIKE %s",
                       [f"%-- plan generation {generation}"])
        [(name, params)] = cursor.fetchall()
        cursor.execute(f"EXPLAIN EXECUTE {name}({', '.join(['NULL'] * params)})")
        return "\n".join(line for (line,) in cursor.fetchall())


def test_the_hot_path_prepares_its_fenced_statements_and_reuses_their_plans():
    connection.close()  # a session of its own: prepared statements live as long as the connection
    run_to_completion(8)  # more executions than PostgreSQL's 5 custom plans before it tries a generic one
    statements = prepared_statements()
    # The pass's look for pending bulk items, once: prepared too, as the engine's own statements are.
    probe = "SELECT EXISTS (SELECT 1 FROM run_bulk_item"
    assert [sum(counts) for s, counts in statements.items() if s.startswith(probe)] == [1], statements
    statements = {s: counts for s, counts in statements.items() if not s.startswith(probe)}
    # Only the engine's own statements: Django's queries are client-side. (The claim is the one with concurrency
    # limits, WITH chosen AS: tests.workflows declares limited workflows; or the claim of several, WITH ready AS.)
    engine = ("WITH fence AS", "WITH created AS", "WITH claimed AS", "WITH chosen AS", "WITH ready AS")
    assert statements and all(s.startswith(engine) for s in statements), statements
    # The run's insert, its claim (with its first intent), 3 results.
    assert sum(generic + custom for generic, custom in statements.values()) == 8 * 5, statements
    result_with_intent = [counts for s, counts in statements.items() if "intent AS (" in s]
    assert result_with_intent and result_with_intent[0][0] > 0, statements  # planned once, then reused


def test_a_plan_made_on_small_tables_is_made_anew_after_replan_every_executions(monkeypatch):
    monkeypatch.setattr(sql, "REPLAN_EVERY", 60)  # 15 runs of 4 fenced statements
    connection.close()  # a new connection counts its executions from 0
    run_to_completion(2)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE run_step, run_state")  # the tables as PostgreSQL sees a new install
    run_to_completion(3)  # 20 executions: the result statement has its generic plan for a 1-page table
    assert "Seq Scan on run_step" in result_with_intent_plan(0)

    with connection.cursor() as cursor:  # the table grows past what a sequential scan should read per step
        cursor.execute("INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch,"
                       " reason, input, created_at, updated_at) VALUES ('filler', 'scripted', '', 'completed',"
                       " 0, '', 0, '', '{}', now(), now())")
        cursor.execute("INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, finished_at,"
                       " result, error, resolution, owner, epoch, loop_cursor, progress)"
                       " SELECT 'filler', 'step-' || g, 1, 'completed', 'filler/' || g, now(), now(), 'null',"
                       " '', '', '', 0, 0, '{}' FROM generate_series(1, 20000) g")
    run_to_completion(20)  # 80 more executions: generation 1 began at the 60th and has its generic plan
    plan = result_with_intent_plan(1)
    assert "Index Scan using run_step_pkey on run_step" in plan and "Seq Scan on run_step" not in plan, plan


RUNS_SQL = ("INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, reason, input,"
            " created_at, updated_at) SELECT %s || g, 'scripted', '', %s, 0, '', 0, '', '{}',"
            " now() + g * interval '1 ms', now() FROM generate_series(1, %s) g")


def claim_plan(*, planning: str, statement: str = claims.CLAIM, **extra: object) -> str:
    """EXPLAIN of the engine's claim, sent with `planning` in front as the engine sends its own."""
    with connection.cursor() as cursor:
        cursor.execute(planning + "EXPLAIN " + statement,
                       {"owner": "w", "shift": timedelta(0), "lease": timedelta(seconds=30), "first_steps": "[]",
                        "hints": True, **extra})
        if planning:
            cursor.nextset()
        return "\n".join(line for (line,) in cursor.fetchall())


def test_a_claim_limited_to_queues_walks_the_same_indexes_in_priority_order():
    with connection.cursor() as cursor:
        cursor.execute(RUNS_SQL, ["backlog-", "pending", 3000])
        cursor.execute("UPDATE run_state SET queue = 'reports' WHERE run_id IN ('backlog-7', 'backlog-9')")
        cursor.execute("UPDATE run_state SET priority = 1 WHERE run_id = 'backlog-9'")
        cursor.execute("ANALYZE run_state")
    plan = claim_plan(planning=claims.CLAIM_PLANNING, statement=claims.CLAIMS[True, True, False], queues=["reports"])
    assert walks_the_indexes(plan), plan
    taken = [store.claim(owner="w", lease_seconds=30, queues=("reports",), hints=True) for _ in range(3)]
    assert [t.lease.run_id if t else None for t in taken] == ["backlog-9", "backlog-7", None]
    assert store.claim(owner="w", lease_seconds=30, hints=True).lease.run_id == "backlog-1"


def walks_the_indexes(plan: str) -> bool:
    """The claim's two probes walk their indexes in order (the oldest pending run, the earliest wake time come),
    and nothing is sorted (a sort under enable_sort = off would also make the plan costly enough for JIT)."""
    return ("Index Scan using run_state_ready_idx" in plan and "Index Scan using run_state_wake_idx" in plan
            and "Sort" not in plan and "JIT" not in plan)


def test_a_backlog_is_claimed_by_walking_the_index_whatever_the_statistics_say():
    connection.close()  # a session of its own: prepared statements live as long as the connection
    with connection.cursor() as cursor:  # statistics that say nothing is due, then a backlog of 3,000 runs
        cursor.execute(RUNS_SQL, ["done-", "completed", 1])
        cursor.execute("ANALYZE run_state")
        cursor.execute("TRUNCATE run_state CASCADE")
        cursor.execute(RUNS_SQL, ["backlog-", "pending", 3000])
    # what the statistics alone would have PostgreSQL do, at each claim: sort the backlog
    assert "Sort Key: run_state.priority DESC, run_state.created_at" in claim_plan(planning="")
    plan = claim_plan(planning=claims.CLAIM_PLANNING)
    assert walks_the_indexes(plan), plan
    claimed = [store.claim(owner="w", lease_seconds=30) for _ in range(8)]
    assert [c.lease.run_id if c else None for c in claimed] == [f"backlog-{n}" for n in range(1, 9)]
    # The claim is prepared: the plan PostgreSQL caches for it was made under the setting too.
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, cardinality(parameter_types), generic_plans FROM pg_prepared_statements"
                       " WHERE statement LIKE '%FOR UPDATE SKIP LOCKED%'")  # the claim (limited or not)
        [(name, params, generic)] = cursor.fetchall()
        cursor.execute(f"EXPLAIN EXECUTE {name}({', '.join(['NULL'] * params)})")
        cached = "\n".join(line for (line,) in cursor.fetchall())
    assert generic > 0 and walks_the_indexes(cached), cached
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_sort")
        assert cursor.fetchone()[0] == "on"  # the setting held for the claim only


def test_a_claim_that_fails_leaves_the_connection_out_of_its_transaction():
    [run_id] = [durableruns.start("scripted", {})]
    db = settings.DATABASES["default"]
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]) as other:
        other.execute("LOCK TABLE run_state IN ACCESS EXCLUSIVE MODE")  # held until `other` commits
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '100ms'")
        with pytest.raises(OperationalError, match="lock timeout"):
            store.claim(owner="w", lease_seconds=30)
        assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
    claimed = store.claim(owner="w", lease_seconds=30)
    assert claimed is not None and claimed.lease.run_id == run_id and claimed.lease.epoch == 1


def test_with_the_setting_off_nothing_is_prepared(settings):
    run_to_completion(1)
    before = prepared_statements()
    settings.DURABLERUNS_PREPARED_STATEMENTS = False
    run_ids = run_to_completion(3)
    assert prepared_statements() == before  # not one more execution of a prepared statement
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.COMPLETED, cursor=3).count() == 3


def test_where_django_logs_queries_the_statements_are_logged_with_their_values():
    with CaptureQueriesContext(connection) as captured:
        [run_id] = run_to_completion(1)
    logged = [q["sql"] for q in captured.captured_queries]
    assert all(isinstance(sql, str) and sql for sql in logged), logged
    facts = [sql for sql in logged if sql.lstrip().startswith("WITH fence AS")]  # 3 results
    assert len(facts) == 3 and all(f"'{run_id}'" in sql for sql in facts), facts
    claims = [sql for sql in logged if "FOR UPDATE SKIP LOCKED" in sql]  # with the first intent and its workflow
    assert len(claims) == 1 and "INSERT INTO run_step" in claims[0] and '"scripted"' in claims[0], claims


def test_the_deployments_own_prepare_threshold_and_plan_cache_mode_are_left_alone():
    connection.close()
    connection.ensure_connection()
    connection.connection.prepare_threshold = 5  # as OPTIONS {"prepare_threshold": 5} would set it
    run_to_completion(8)
    statements = prepared_statements()
    assert any(s.startswith("WITH fence AS") for s in statements), statements
    assert connection.connection.prepare_threshold == 5
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "auto"


# -- a fresh run's first intent rides on its claim ----------------------------------------------------------


def claim_fresh(**kwargs) -> store.Claimed | None:
    return store.claim(owner="w", lease_seconds=30, first_steps=first_steps(), **kwargs)


def rows(run_id: str) -> list[tuple[str, int, str, str, str, int]]:
    return list(RunStep.objects.filter(run_id=run_id).order_by("step", "attempt")
                .values_list("step", "attempt", "status", "effect_key", "owner", "epoch"))


def test_a_fresh_run_has_its_first_intent_recorded_in_the_claims_commit():
    run_id = durableruns.start("scripted", {})
    claimed = claim_fresh()
    assert claimed is not None and claimed.attempts == []  # the boundary sees the run as it was: fresh
    assert claimed.first_intent == Intent(step="first", attempt=1, effect_key=effect_key(run_id, "first"), cursor=0)
    assert rows(run_id) == [("first", 1, "started", effect_key(run_id, "first"), "w", claimed.lease.epoch)]
    # Its start is the claim's own time, on the database's clock (the claim's statement wrote both).
    assert RunStep.objects.get(run_id=run_id).started_at == RunState.objects.get(pk=run_id).updated_at
    # The engine takes it from there: no second intent, one attempt per step.
    outcome = Engine().work(claimed)
    assert outcome.status == RunStatus.COMPLETED and outcome.steps_run == 3
    assert [(step, attempt, status) for step, attempt, status, *_ in rows(run_id)] == [
        ("first", 1, "completed"), ("second", 1, "completed"), ("third", 1, "completed")]


def test_no_first_intent_rides_on_the_claim_of_a_run_that_is_not_fresh_or_not_this_deploys():
    in_doubt = durableruns.start("scripted", {})
    crash_after_intent(in_doubt, "first", started_at=timezone.now() - timedelta(minutes=5))
    retired = durableruns.start("scripted", {})
    RunState.objects.filter(pk=retired).update(workflow="scripted_2025")
    replanned = durableruns.start("scripted", {})
    RunState.objects.filter(pk=replanned).update(plan_fingerprint="0" * 16)
    unlisted = durableruns.start("scripted", {})
    claimed = [claim_fresh() for _ in range(3)] + [store.claim(owner="w", lease_seconds=30)]
    assert [c.lease.run_id for c in claimed] == [in_doubt, retired, replanned, unlisted]
    assert [c.first_intent for c in claimed] == [None] * 4
    assert rows(in_doubt) == [("first", 1, "started", effect_key(in_doubt, "first"), "dead-worker", 1)]
    assert rows(retired) == rows(replanned) == rows(unlisted) == []


def test_the_fault_point_before_a_first_intent_on_the_claim_sees_nothing_recorded():
    run_id = durableruns.start("scripted", {})
    db = settings.DATABASES["default"]
    seen = []

    def before(step: str) -> None:
        with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]) as other:
            state = other.execute("SELECT status, epoch FROM run_state WHERE run_id = %s", [run_id]).fetchone()
            steps = other.execute("SELECT count(*) FROM run_step WHERE run_id = %s", [run_id]).fetchone()
        seen.append((step, state, steps))
        raise RuntimeError("killed here")

    with pytest.raises(RuntimeError, match="killed here"):
        claim_fresh(before_first_intent=before)
    assert seen == [("first", ("pending", 0), (0,))]  # neither the claim nor the intent was committed
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert RunState.objects.get(pk=run_id).status == RunStatus.PENDING and rows(run_id) == []
    claimed = claim_fresh(before_first_intent=lambda step: seen.append(step))
    assert claimed is not None and claimed.lease.epoch == 1 and seen[-1] == "first"
    assert rows(run_id) == [("first", 1, "started", effect_key(run_id, "first"), "w", 1)]
