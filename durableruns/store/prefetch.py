"""Several due runs in one claim, for a single pass that drains what is due (resume_runs --once, resume_due): the
runs a thread does not begin at once wait in the pass's queue (durableruns.worker.prefetch) for the next free
thread of the process. On PostgreSQL, with prepared statements, on a record not distributed.

A claim is a transaction of its own, with a round trip, probes of two indexes and its plan's execution: taken
once for several runs, each run pays a share of it. `bench.statements` measured, with 8 threads, 2,000 runs of 5
no-op steps whose results share one commit: 3,800 steps/s one run a claim, 6,200 four a claim.

What it changes, and what it does not:
- Each run is taken as a claim of one takes it: its epoch moves on, its lease is this worker's (renewed by the
  heartbeat from the claim on), in the claim's order. Every later write is fenced on that epoch, as ever.
- The first run of the claim (the one its thread begins at once) gets its first step's intent in the claim's
  commit, as a claim of one gives it. The others record theirs when they are begun, with the time they are: a
  run waiting in the process has no attempt, so a worker that dies holding it leaves nothing of it in doubt.
- A run whose concurrency limit must admit it is never among them: the claim stops before it, and a claim of one
  admits or parks it under its key's lock (store.claims), so the limits hold exactly as they did.
- A worker that dies holding runs it has not begun leaves them leased until their leases run out, as it leaves
  the run in hand: each is taken over then (and counts as taken over: TAKEOVERS). A pass that ends with runs
  it has not begun (a stop asked for, --max-seconds) hands them back at once (`hand_back`).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any

from django.db import connections, transaction

from durableruns import conf
from durableruns.clock import Clock
from durableruns.models import RunState, RunStatus
from durableruns.registry import FirstSteps, limits
from durableruns.store.base import DATABASE, Claimed, Intent, Lease, decoded, fast, wake_workers
from durableruns.store.claims import ATTEMPTS, FIRST_INTENT, RETURNING, TAKE, attempt_of, first_steps_json, variant
from durableruns.store.runs import let_go
from durableruns.store.sql import hot_path

# The claim's order, over both probes' rows: priority first, then the time each was due (a ready run when it was
# recorded, a woken one at its wake time), then the one recorded first (as store.claims' _WOKEN_FIRST decides
# between its two). Sorting these few rows is the only sort: jit off, since enable_sort = off (which keeps the
# probes on their indexes) prices any sort so high that PostgreSQL would compile the plan.
_ORDER = "priority DESC, due, created_at"
PLANNING = "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"

_SEVERAL = """
WITH ready AS MATERIALIZED (
  SELECT run_id, priority, created_at, created_at AS due, status, workflow, concurrency_key, deadline_at
    FROM run_state
   WHERE status IN ('pending', 'running')
     AND (status = 'pending' OR lease_expires_at < now() + %(shift)s){queues}{skip}
   ORDER BY priority DESC, created_at LIMIT {most} FOR UPDATE SKIP LOCKED),
woken AS MATERIALIZED (
  SELECT run_id, priority, created_at, wake_at AS due, status, workflow, concurrency_key, deadline_at
    FROM run_state
   WHERE status = 'waiting' AND wake_at <= now() + %(shift)s{queues}{skip}
   ORDER BY wake_at, created_at LIMIT {most} FOR UPDATE SKIP LOCKED),
chosen AS MATERIALIZED (
  SELECT run_id, priority, due, created_at FROM (
    SELECT run_id, priority, due, created_at,
           -- a run its concurrency limit must admit (as store.claims' verdict decides), and every one after it,
           -- are left to a claim of one, which admits or parks it under its key's lock
           bool_or(status <> 'running' AND concurrency_key IS NOT NULL AND workflow = ANY(%(limited)s::text[])
                   AND NOT coalesce(deadline_at <= now() + %(shift)s, false))
             OVER (ORDER BY """ + _ORDER + """ ROWS UNBOUNDED PRECEDING) AS limited
      FROM (SELECT * FROM ready UNION ALL SELECT * FROM woken) AS due_runs) AS ordered
   WHERE NOT limited ORDER BY """ + _ORDER + """ LIMIT {most}),
lead AS MATERIALIZED (SELECT run_id FROM chosen ORDER BY """ + _ORDER + """ LIMIT 1),
claimed AS (
  """ + TAKE + """
   WHERE run_id IN (SELECT run_id FROM chosen)
  """ + RETURNING + """),
-- the first intent of the run begun at once only: the others record theirs when they are begun
first AS (""" + FIRST_INTENT.replace("{lead}", " AND c.run_id = (SELECT run_id FROM lead)") + """
  RETURNING run_id, step, effect_key)
SELECT c.run_id, c.epoch, c.workflow, c.plan_fingerprint, c.input, """ + ATTEMPTS + """,
       f.step, f.effect_key, c.ending, c.trace_context, c.key_run_id,
       coalesce(c.deadline_at <= now() + %(shift)s, false), c.takeovers
  FROM claimed c JOIN chosen o ON o.run_id = c.run_id LEFT JOIN first f ON f.run_id = c.run_id
 ORDER BY """ + ", ".join(f"o.{column}" for column in _ORDER.split(", ")) + """
"""


def several_text(most: int, *, in_queues: bool, skipping: bool) -> str:
    """The claim of at most `most` runs, for a worker limited to queues or not, in a pass that leaves some runs out
    or not: the number is spelled in the text, so each size is a statement (and a plan) of its own."""
    return variant(_SEVERAL.replace("{most}", str(int(most))), in_queues=in_queues, skipping=skipping)


def prefetches() -> bool:
    """Whether this thread's claims may take several runs: PostgreSQL's one-statement path, with prepared
    statements, and more than one run a claim asked for (DURABLERUNS_PREFETCH)."""
    return conf.prefetch() > 1 and fast() and hot_path() is not None


def limited() -> list[str]:
    """The workflows of this deploy with a concurrency limit: a claim of several stops before the first run one of
    them must admit."""
    return sorted(limits())


def claim_several(*, owner: str, lease_seconds: float, most: int, clock: Clock = DATABASE,
                  first_steps: FirstSteps = (), queues: tuple[str, ...] = (),
                  skip: Collection[str] = ()) -> list[Claimed]:
    """Take at most `most` due runs in the claim's order, in one statement and one commit (`prefetches` says
    when); the first is the one to begin at once. None due, or the first due must be admitted by its concurrency
    limit: [] (a claim of one takes it, or parks it)."""
    import psycopg

    params: dict[str, Any] = {"owner": owner, "first_steps": first_steps_json(first_steps),
                              "limited": limited(), "shift": clock.shift, "lease": timedelta(seconds=lease_seconds)}
    if queues:
        params["queues"] = list(queues)
    if skip:
        params["skip"] = sorted(skip)
    statement = several_text(most, in_queues=bool(queues), skipping=bool(skip))
    hot = hot_path()
    if hot is None:
        raise RuntimeError("claim_several needs the prepared path (prefetches())")
    db = connections[conf.database()]
    raw = db.connection
    with db.wrap_database_errors:
        try:
            with raw.pipeline():  # BEGIN, the settings, the claim and COMMIT in one round trip
                raw.execute("BEGIN")
                raw.execute(PLANNING)
                hot.cursor.execute(hot.text(statement), params)
                raw.execute("COMMIT")
            rows = hot.cursor.fetchall()
        except BaseException:
            if not raw.closed and raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raw.execute("ROLLBACK")
            raise
    return [Claimed(lease=Lease(run_id=run_id, owner=owner, epoch=epoch, seconds=lease_seconds),
                    workflow=workflow, plan_fingerprint=fingerprint, input=decoded(payload) or {},
                    attempts=[attempt_of(a) for a in decoded(attempts)],
                    first_intent=None if step is None else Intent(step=step, attempt=1, effect_key=str(key),
                                                                  cursor=0),
                    ending=ending or "", trace_context=decoded(trace), key_run_id=keys, overdue=bool(overdue),
                    takeovers=takeovers or 0)
            for (run_id, epoch, workflow, fingerprint, payload, attempts, step, key, ending, trace, keys, overdue,
                 takeovers) in rows]


def hand_back(claimed: Claimed, *, clock: Clock = DATABASE) -> bool:
    """Give back a run claimed ahead and never begun: due again at once (pending), its lease cleared (the record is
    as before the claim, but for the epoch); fenced on the claim's epoch. False if the run is no longer this
    claim's.

    A run staff ended or moved on while it waited here (a cancel) kept this worker's lease, which holds a limited
    run's slot while its worker may be inside a far call: this one never began, so it lets go at once
    (store.runs.let_go), as a pass fenced out of a run it had begun does."""
    lease = claimed.lease
    with transaction.atomic(using=conf.database(), durable=True):
        moved = RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch, status=RunStatus.RUNNING).update(
            status=RunStatus.PENDING, lease_expires_at=None, wake_at=None, reason="", updated_at=clock.expression()
        )
        if moved:
            wake_workers()
    if not moved:
        let_go(lease)
    return bool(moved)
