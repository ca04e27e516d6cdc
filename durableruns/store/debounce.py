"""A debounced start (durableruns.start(..., debounce=, key=)): while a run started with the key has not begun,
a start with the same key replaces its input and moves its start to now + debounce; once it has begun, the next
start with the key records a new run. With its PostgreSQL statement.

The runs a start may still replace are those with the key, not begun and not ended (models.DEBOUNCING), at most
one per workflow and key (run_state_debounce_key_uniq). The claim that begins a run clears its key in the same
UPDATE that takes it (store.claims), so a start and a claim meet on the row's lock: a start that comes after the
claim's commit finds no run to replace and records a new one (PostgreSQL's ON CONFLICT looks again once the
row it waited on is committed, and that row no longer conflicts). Concurrent starts with one key meet on the
unique index: one inserts, the others replace its input, and all return its run id.

On a record distributed by Citus the runs with one key may sit on any shard, and a unique key without run_id
cannot be kept there (distribute_runs drops run_state_debounce_key_uniq and indexes the same runs without
uniqueness). The key's uniqueness is kept by serializing its starts instead: a debounced start first takes the
key's transaction-scoped advisory lock on the coordinator, then looks for the run not begun with the key across
the shards, in a statement after the lock (so it sees every start of the key committed before it got the lock),
locks that run by its id and replaces its input if it has still not begun (a claim that took it meanwhile cleared
its key: then a new run is recorded). The writes name one run_id, so the commit is that run's node's alone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction

from durableruns import conf, signals
from durableruns.clock import Clock
from durableruns.distribution import is_distributed
from durableruns.encoding import to_json
from durableruns.errors import DuplicateRun
from durableruns.models import DEBOUNCING, RunState, RunStatus
from durableruns.plans import Plan
from durableruns.store.attributes import write_attributes
from durableruns.store.base import DATABASE, fast, wake_workers
from durableruns.store.plans import record_plan
from durableruns.store.sql import WAKE_CHANNEL, one

# Why a debounced run waits, as its boundary says it.
DEBOUNCED = "debounced: it starts at its wake time, unless a start with its key moves that time on"

# The insert, or the replacement of the run not begun with the key; idle workers wake to take the new wake time
# into their timers. The run's creation time stays the first start's; its wake time is the last start's + debounce.
_DEBOUNCE = (
    """
WITH upserted AS (
  INSERT INTO run_state AS r (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, lease_expires_at,
                              wake_at, reason, input, priority, queue, trace_context, concurrency_key, debounce_key,
                              created_at, updated_at)
  VALUES (%(run)s, %(workflow)s, %(fingerprint)s, 'waiting', 0, '', 0, NULL, now() + %(shift)s + %(debounce)s,
          %(reason)s, %(input)s::jsonb, %(priority)s, %(queue)s, %(trace)s::jsonb, %(limit_key)s::text, %(key)s,
          now() + %(shift)s, now() + %(shift)s)
  ON CONFLICT (workflow, debounce_key) WHERE debounce_key IS NOT NULL AND status IN ('pending', 'waiting')
  DO UPDATE SET input = EXCLUDED.input, plan_fingerprint = EXCLUDED.plan_fingerprint, status = 'waiting',
                wake_at = EXCLUDED.wake_at, reason = EXCLUDED.reason, concurrency_key = EXCLUDED.concurrency_key,
                updated_at = EXCLUDED.updated_at
  RETURNING r.run_id, (r.xmax = 0) AS created)
SELECT run_id, created, pg_notify('"""
    + WAKE_CHANNEL
    + """', '') FROM upserted
"""
)


# A debounce key's starts, one at a time, on a distributed record (the module's docstring): a lock space of its own.
_KEY_LOCK = "SELECT pg_advisory_xact_lock(hashtext('durableruns.debounce'), hashtext(%s || E'\\n' || %s))"


def debounce_run(
    *,
    run_id: str,
    workflow: str,
    plan_fingerprint: str,
    input: dict[str, Any],
    key: str,
    debounce: timedelta,
    clock: Clock = DATABASE,
    plan: Plan | None = None,
    trace_context: dict[str, str] | None = None,
    priority: int = 0,
    queue: str = "default",
    concurrency_key: str | None = None,
    attributes: dict[str, Any] | None = None,
    deadline: timedelta | datetime | None = None,
    on_deadline: str | None = None,
) -> tuple[str, bool]:
    """Record a run of `workflow` started with `key`, due `debounce` from the database's now, or replace the input
    and move the start of the run with that key that has not begun yet; return its run id and whether it is new.
    A new run's id is `run_id` (a run already recorded under that id: DuplicateRun). `attributes` (checked
    already) are recorded, or replace the run's, in the same commit; a new run records `deadline` (a span from
    its creation, or a time) and `on_deadline` (durableruns.deadlines)."""
    if plan is not None:
        record_plan(plan, clock=clock)  # its own commit, once per fingerprint and process
    if not attributes and deadline is None and not connections[conf.database()].in_atomic_block and fast():
        try:
            row = one(
                _DEBOUNCE,
                {
                    "run": run_id,
                    "workflow": workflow,
                    "fingerprint": plan_fingerprint,
                    "shift": clock.shift,
                    "debounce": debounce,
                    "reason": DEBOUNCED,
                    "input": to_json(input, what="the input"),
                    "priority": priority,
                    "queue": queue,
                    "trace": None if trace_context is None else to_json(trace_context, what="the trace"),
                    "limit_key": concurrency_key,
                    "key": key,
                },
            )
        except IntegrityError:
            raise DuplicateRun(run_id=run_id) from None
        found, created = str(row[0]), bool(row[1])
    else:
        found, created = _orm_debounce(
            run_id=run_id,
            workflow=workflow,
            plan_fingerprint=plan_fingerprint,
            input=input,
            key=key,
            debounce=debounce,
            clock=clock,
            priority=priority,
            queue=queue,
            trace_context=trace_context,
            concurrency_key=concurrency_key,
            attributes=attributes or {},
            deadline=deadline,
            on_deadline=on_deadline,
        )
    if created:
        signals.send_on_commit(signals.run_started, RunState, run_id=found, workflow=workflow)
    return found, created


def _orm_debounce(
    *,
    run_id: str,
    workflow: str,
    plan_fingerprint: str,
    input: dict[str, Any],
    key: str,
    debounce: timedelta,
    clock: Clock,
    priority: int,
    queue: str,
    trace_context: dict[str, str] | None,
    concurrency_key: str | None,
    attributes: dict[str, Any],
    deadline: timedelta | datetime | None,
    on_deadline: str | None,
) -> tuple[str, bool]:
    """The portable path (SQLite; PostgreSQL inside a caller's transaction; a record distributed by Citus): replace
    the run not begun with the key, else create one; a create that meets a concurrent one on the unique index
    replaces that one instead. On a distributed record the key's starts are serialized by its lock (the module's
    docstring)."""
    database = conf.database()
    spread = is_distributed(database)
    for _ in range(3):
        try:
            with transaction.atomic(using=database):
                pending = RunState.objects.filter(DEBOUNCING, workflow=workflow, debounce_key=key)
                if spread:
                    with connections[database].cursor() as cursor:
                        cursor.execute(_KEY_LOCK, [workflow, key])
                    seen = pending.values_list("run_id", flat=True).first()  # across the shards, after the lock
                    # Locked by its id, on its shard: a claim that took it since has cleared its key.
                    found = (None if seen is None else
                             pending.filter(run_id=seen).select_for_update().values_list("run_id", flat=True).first())
                else:
                    found = pending.select_for_update().values_list("run_id", flat=True).first()
                if found is not None:
                    pending.filter(run_id=found).update(
                        input=input,
                        plan_fingerprint=plan_fingerprint,
                        status=RunStatus.WAITING,
                        wake_at=clock.expression(debounce),
                        reason=DEBOUNCED,
                        concurrency_key=concurrency_key,
                        updated_at=clock.expression(),
                    )
                    write_attributes(found, attributes)
                    wake_workers()
                    return found, False
                if RunState.objects.filter(pk=run_id).exists():
                    raise DuplicateRun(run_id=run_id)
                RunState.objects.create(
                    run_id=run_id,
                    workflow=workflow,
                    plan_fingerprint=plan_fingerprint,
                    input=input,
                    status=RunStatus.WAITING,
                    wake_at=clock.expression(debounce),
                    reason=DEBOUNCED,
                    priority=priority,
                    queue=queue,
                    concurrency_key=concurrency_key,
                    debounce_key=key,
                    trace_context=trace_context,
                    created_at=clock.expression(),
                    updated_at=clock.expression(),
                    deadline_at=clock.expression(deadline) if isinstance(deadline, timedelta) else deadline,
                    on_deadline=on_deadline,
                )
                write_attributes(run_id, attributes)
                wake_workers()
                return run_id, True
        except IntegrityError:
            continue  # a concurrent start with the key created its run first: replace that one
    raise DuplicateRun(run_id=run_id)
