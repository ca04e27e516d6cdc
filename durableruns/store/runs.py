"""A run's life outside its steps: its creation, the lease a worker renews, its release, its end, and the
reopening of runs stopped for lacking steps; with their PostgreSQL statements (the claim is store.claims)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F

from durableruns import conf, signals
from durableruns.boundary import compute_boundary
from durableruns.clock import Clock
from durableruns.encoding import storable, to_json
from durableruns.errors import DuplicateRun, FencedOut
from durableruns.holdings import given_back
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from durableruns.plans import Plan, lacking
from durableruns.registry import get_workflow, workflows
from durableruns.store.attributes import write_attributes
from durableruns.store.base import (
    DATABASE,
    DEFERRED,
    ENDED,
    Lease,
    fast,
    fence,
    lease_times,
    wake_workers,
)
from durableruns.store.cancels import SYSTEM_ACTOR, announce_cancelled, cancel_with
from durableruns.store.children import wake_parent
from durableruns.store.plans import plan_of, record_plan
from durableruns.store.sql import WAKE_CHANNEL, Times, hot_path, one, rowcount

# The insert wakes idle workers in the same statement. A deferred run (`wake`: not due before it) is waiting
# until then, and the claim takes it once the database's now reaches that time.
_CREATE_RUN = """
WITH created AS (
  INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, lease_expires_at,
                         wake_at, reason, input, priority, queue, trace_context, concurrency_key, deadline_at,
                         on_deadline, created_at, updated_at)
  VALUES (%(run)s, %(workflow)s, %(fingerprint)s,
          CASE WHEN %(wake)s::timestamptz IS NULL THEN 'pending' ELSE 'waiting' END, 0, '', 0, NULL,
          %(wake)s::timestamptz, CASE WHEN %(wake)s::timestamptz IS NULL THEN '' ELSE %(deferred)s END,
          %(input)s::jsonb, %(priority)s, %(queue)s, %(trace)s::jsonb, %(limit_key)s::text,
          coalesce(%(deadline_at)s::timestamptz, now() + %(shift)s + %(deadline_after)s::interval), %(on_deadline)s::text,
          now() + %(shift)s, now() + %(shift)s)
  RETURNING run_id)
SELECT pg_notify('""" + WAKE_CHANNEL + """', '') FROM created
"""


# A heartbeat: the lease runs on from the database's now, and the attempt in hand (started under this epoch)
# records that its process was alive then and the lease it now holds: a worker lost after this renewal may still
# have made its call at any moment until that lease ran out (policies.last_call_bound).
_RENEW = """
WITH fence AS (
  UPDATE run_state SET updated_at = now() + %(shift)s, lease_expires_at = now() + %(shift)s + %(lease)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s AND status = 'running'
  RETURNING run_id),
seen AS (
  UPDATE run_step SET renewed_at = now() + %(shift)s, held_until = now() + %(shift)s + %(lease)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s AND status = 'started' AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT count(*) FROM fence
"""

# Every lease a process holds, in one statement: the held (run, epoch, lease seconds) as arrays; the runs renewed
# come back, and any other was released or taken over.
_RENEW_ALL = """
WITH held AS (
  SELECT * FROM unnest(%(runs)s::text[], %(epochs)s::bigint[], %(seconds)s::float8[]) AS h(run_id, epoch, seconds)),
fence AS (
  UPDATE run_state r SET updated_at = now() + %(shift)s,
         lease_expires_at = now() + %(shift)s + h.seconds * interval '1 second'
    FROM held h
   WHERE r.run_id = h.run_id AND r.epoch = h.epoch AND r.status = 'running'
  RETURNING r.run_id, r.epoch, r.lease_expires_at),
seen AS (
  UPDATE run_step s SET renewed_at = now() + %(shift)s, held_until = f.lease_expires_at
    FROM fence f
   WHERE s.run_id = f.run_id AND s.epoch = f.epoch AND s.status = 'started'
  RETURNING 1)
SELECT run_id FROM fence
"""


def _pg_create_run(*, run: str, workflow: str, fingerprint: str, input: str, trace: str | None = None, priority: int = 0,
               queue: str = "default", wake_at: datetime | None = None, deferred: str = "",
               concurrency_key: str | None = None, deadline: timedelta | datetime | None = None,
               on_deadline: str | None = None, shift: timedelta = timedelta(0)) -> None:
    """Record a pending run (`input`, and `trace`, its trace context or None, as JSON text) created at the
    database's now, or a waiting one until `wake_at` (with `deferred` as its reason): the row
    RunState.objects.create writes, without building it through the ORM. A duplicate run_id raises Django's
    IntegrityError."""
    rowcount(_CREATE_RUN, {"run": run, "workflow": workflow, "fingerprint": fingerprint, "input": input,
                            "trace": trace, "priority": priority, "queue": queue, "wake": wake_at,
                            "deferred": deferred, "limit_key": concurrency_key, "on_deadline": on_deadline,
                            "deadline_at": deadline if isinstance(deadline, datetime) else None,
                            "deadline_after": deadline if isinstance(deadline, timedelta) else None, "shift": shift})


def _pg_renew_all(*, runs: list[str], epochs: list[int], seconds: list[float], shift: timedelta) -> set[str]:
    """Extend the leases of many running runs at once from the database's now; return the runs renewed."""
    hot = hot_path()
    params: dict[str, Any] = {"runs": runs, "epochs": epochs, "seconds": seconds, "shift": shift}
    if hot is None:
        with connections[conf.database()].cursor() as cursor:
            cursor.execute(_RENEW_ALL, params)
            return {run for (run,) in cursor.fetchall()}
    hot.cursor.execute(hot.text(_RENEW_ALL), params)
    return {run for (run,) in hot.cursor.fetchall()}


def _pg_renew(*, run: str, epoch: int, times: Times) -> bool:
    """Extend a running run's lease from the database's now and mark its attempt in hand alive; False if the
    epoch is stale or the run is no longer running."""
    return int(one(_RENEW, {"run": run, "epoch": epoch, **times})[0]) == 1


def create_run(*, run_id: str, workflow: str, plan_fingerprint: str, input: dict[str, Any],
               clock: Clock = DATABASE, plan: Plan | None = None, trace_context: dict[str, str] | None = None,
               priority: int = 0, queue: str = "default", run_after: datetime | None = None,
               concurrency_key: str | None = None, deadline: timedelta | datetime | None = None,
               on_deadline: str | None = None, attributes: dict[str, Any] | None = None) -> None:
    """Record a pending run, created at the database's now; a worker picks it up (with `run_after`, a run
    waiting until then: the claim compares it with the database's now). `plan`, the run's plan, is recorded with
    it the first time this process starts a run of that fingerprint. `trace_context`: the trace the run's passes
    continue (durableruns.tracing), if one was current. `concurrency_key`: the key the run counts under for its
    workflow's concurrency limit ("" for the whole workflow), or None for a workflow without one. `deadline`: when
    the run must have ended, a time or a span from its creation at the database's now (durableruns.deadlines), and
    `on_deadline` what it then ends as. `attributes` (checked already, durableruns.attributes): recorded in the
    same commit as the run.

    One INSERT (on PostgreSQL outside a transaction, the hot path's prepared one). Inside the caller's transaction
    it joins it (behind a savepoint, so a duplicate does not break it): the run then exists exactly when the
    caller's own records do.
    """
    deferred = "" if run_after is None else DEFERRED
    created = clock.expression()  # one reading on SQLite: a deadline span is counted from the very same moment
    deadline_at: Any = deadline
    if isinstance(deadline, timedelta):
        deadline_at = created + deadline if isinstance(created, datetime) else clock.expression(deadline)
    fields = {"run_id": run_id, "workflow": workflow, "plan_fingerprint": plan_fingerprint, "input": input,
              "status": RunStatus.PENDING if run_after is None else RunStatus.WAITING, "wake_at": run_after,
              "reason": deferred, "priority": priority, "queue": queue, "concurrency_key": concurrency_key,
              "created_at": created, "updated_at": created, "trace_context": trace_context,
              "deadline_at": deadline_at, "on_deadline": on_deadline}
    try:
        if attributes or connections[conf.database()].in_atomic_block:
            with transaction.atomic(using=conf.database()):
                if plan is not None:
                    record_plan(plan, clock=clock)
                RunState.objects.create(**fields)
                write_attributes(run_id, attributes or {})
                wake_workers()  # on the caller's commit: a run rolled back wakes nobody
        else:
            if plan is not None:
                record_plan(plan, clock=clock)  # its own commit, once per fingerprint and process
            if fast():
                _pg_create_run(run=run_id, workflow=workflow, fingerprint=plan_fingerprint,
                                 input=to_json(input, what="the input"),
                                 trace=None if trace_context is None else to_json(trace_context, what="the trace"),
                                 priority=priority, queue=queue, wake_at=run_after, deferred=deferred,
                                 concurrency_key=concurrency_key, deadline=deadline, on_deadline=on_deadline,
                                 shift=clock.shift)
            else:  # SQLite, or a record distributed by Citus (no one-statement path): the ORM, and the wake
                with transaction.atomic(using=conf.database()):
                    RunState.objects.create(**fields)
                    wake_workers()
    except IntegrityError:
        raise DuplicateRun(run_id=run_id) from None
    signals.send_on_commit(signals.run_started, RunState, run_id=run_id, workflow=workflow)  # signals


def renew(lease: Lease, *, clock: Clock = DATABASE) -> None:
    """Extend the lease from the database's now, and record that the attempt in hand was alive then (the last
    moment its process could still have made its call); FencedOut if another worker took the run.

    On PostgreSQL a single statement in autocommit, never an open transaction: a worker paused between BEGIN and
    COMMIT would hold the run's row lock, and nobody could take the run over.
    """
    if fast():
        renewed = _pg_renew(run=lease.run_id, epoch=lease.epoch, times=lease_times(lease, clock))
    else:
        with transaction.atomic(using=conf.database(), durable=True):
            renewed = bool(RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch, status=RunStatus.RUNNING)
                           .update(updated_at=clock.expression(), lease_expires_at=clock.expression(lease.duration)))
            if renewed:
                RunStep.objects.filter(run_id=lease.run_id, epoch=lease.epoch, status=StepStatus.STARTED).update(
                    renewed_at=clock.expression(), held_until=clock.expression(lease.duration))
    if not renewed:
        raise FencedOut("the run was released or taken over", run_id=lease.run_id, epoch=lease.epoch)


def renew_all(leases: list[Lease], *, clock: Clock = DATABASE) -> set[str]:
    """Renew many leases as `renew` does one, in one statement on PostgreSQL; return the run_ids renewed (any
    other was released or taken over)."""
    if not leases:
        return set()
    if fast():
        return _pg_renew_all(runs=[lease.run_id for lease in leases], epochs=[lease.epoch for lease in leases],
                               seconds=[lease.seconds for lease in leases], shift=clock.shift)
    renewed = set()
    for lease in leases:  # SQLite: one worker, a handful of leases
        try:
            renew(lease, clock=clock)
        except FencedOut:
            continue
        renewed.add(lease.run_id)
    return renewed


def release(lease: Lease, *, status: str, clock: Clock = DATABASE, wake_at: datetime | None = None,
            reason: str = "") -> None:
    """Hand the run back: waiting until `wake_at` (a time of the database's clock), or stopped (completed,
    failed, cancelled, needs_decision)."""
    cancelled: tuple[list[str], str] = ([], "")
    with transaction.atomic(using=conf.database(), durable=True):
        if status == RunStatus.CANCELLED:  # its descendants first: a fenced-out worker's commit rolls them back
            cancelled = cancel_with(lease, reason=reason, clock=clock)
        moved = RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(
            status=status, wake_at=wake_at, reason=storable(reason), lease_expires_at=None,
            updated_at=clock.expression()
        )
        if not moved:
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        if status in (RunStatus.PENDING, RunStatus.WAITING):  # due now, or at a time idle workers must learn
            wake_workers()
        elif status in ENDED:
            wake_parent(lease.run_id, clock)
    announce_cancelled(cancelled[0], reason=cancelled[1], by=SYSTEM_ACTOR)
    signals.run_finished(lease.run_id, status, reason=storable(reason))  # signals: completed, failed, cancelled


def let_go(lease: Lease) -> bool:
    """Say that this worker, fenced out of its run (someone else ended it, or moved it on, while the worker was
    inside a step), has left it: the lease it had, which the run kept so that its concurrency slot stays held
    while the worker may still act at the far system (store.claims), is cleared; a trigger lets the first run
    parked by that limit go (run_state_slot_let_go). A run running again (another worker took it) is not this
    worker's to touch: only its own lease on a run that is not running is cleared. True if one was."""
    with transaction.atomic(using=conf.database(), durable=True):
        return bool(RunState.objects.filter(pk=lease.run_id, owner=lease.owner, epoch__gt=lease.epoch,
                                            lease_expires_at__isnull=False)
                    .exclude(status=RunStatus.RUNNING).update(lease_expires_at=None))


def begin_ending(lease: Lease, *, ending: str, reason: str, clock: Clock = DATABASE) -> None:
    """Record that the run, still in this worker's hands, ends unfinished as `ending` once it has given back
    what it holds: a crash from here on resumes the releasing, not the run."""
    cancelled: tuple[list[str], str] = ([], "")
    with transaction.atomic(using=conf.database(), durable=True):
        if ending == RunStatus.CANCELLED:  # its descendants first: a fenced-out worker's commit rolls them back
            cancelled = cancel_with(lease, reason=reason, clock=clock)
        fence(lease, clock, ending=ending, reason=storable(reason))
    announce_cancelled(cancelled[0], reason=cancelled[1], by=SYSTEM_ACTOR)


def end(lease: Lease, *, clock: Clock = DATABASE, status: str | None = None, reason: str | None = None) -> str:
    """Its releases done, give the run the status it was ending with (the reason already says why), or `status`
    and `reason` where the engine knows better (a run stopped for a missing step whose deploy has it again)."""
    with transaction.atomic(using=conf.database(), durable=True):
        row = RunState.objects.select_for_update().filter(pk=lease.run_id, epoch=lease.epoch).values_list(
            "ending", "reason").first()
        if row is None:
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        status = status or row[0] or RunStatus.CANCELLED
        reason = row[1] if reason is None else storable(reason)
        RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(
            status=status, ending="", wake_at=None, lease_expires_at=None, reason=reason,
            updated_at=clock.expression())
        if status == RunStatus.PENDING:
            wake_workers()
        elif status in ENDED:
            wake_parent(lease.run_id, clock)
    if status == RunStatus.FAILED:  # a cancellation was announced at the staff act that asked for it
        signals.run_finished(lease.run_id, status, reason=reason)
    return status


def reopen_runnable(*, clock: Clock = DATABASE) -> int:
    """Make pending again the runs stopped for staff because a deploy lacked steps of their plan, where this
    deploy has every step they still need; return how many."""
    ready = []
    stopped = (RunState.objects.filter(workflow__in=list(workflows())).stopped_lacking_steps()
               .only("run_id", "workflow", "plan_fingerprint").with_attempts())
    for run in stopped:
        plan = plan_of(run.workflow, run.plan_fingerprint)
        if plan is None:
            continue
        workflow = get_workflow(run.workflow)
        attempts = [a.to_attempt() for a in run.attempts.all()]
        # What it gave back when it stopped is needed again: this deploy must have those steps too.
        again = given_back(workflow.acquisitions(), attempts)
        remainder = compute_boundary(plan.names, attempts, given_back=again).remainder
        if not lacking(plan, workflow.policies(), remainder):
            ready.append(run.run_id)
    return reopen_runs(ready, reason="this deploy has the steps of the run's plan again", clock=clock)


def reopen_runs(run_ids: list[str], *, reason: str, clock: Clock = DATABASE) -> int:
    """Make runs stopped for lacking steps workable again (pending), those still stopped for that reason only;
    the epoch bump fences nobody (no worker holds a stopped run) but keeps every change of hands counted."""
    if not run_ids:
        return 0
    with transaction.atomic(using=conf.database(), durable=True):
        moved = RunState.objects.filter(pk__in=run_ids).stopped_lacking_steps().update(
            status=RunStatus.PENDING, epoch=F("epoch") + 1, wake_at=None, reason=storable(reason),
            updated_at=clock.expression())
        if moved:
            wake_workers()
        return moved



# durableruns.result()'s waiters (RunWaiter, migration 0029). Sent on the caller's own listening connection (a
# psycopg connection in autocommit, PostgreSQL only), never on Django's: a caller inside a transaction of its own
# must not hold the run's row locked, nor keep its waiter uncommitted, while it waits.
_AWAIT_END = ("INSERT INTO run_waiter (run_id) VALUES (%(run)s) RETURNING id",
              "SELECT 1 FROM run_state WHERE run_id = %(run)s FOR SHARE")


def await_end(conn: Any, run_id: str) -> int:
    """Record on `conn` (the caller's listening connection, autocommit) that a caller waits for `run_id` to end, so
    that the commit ending it notifies durableruns_ended; return the waiter's id, for forget_waiter. Call it after
    the LISTEN and before the first read of the record.

    The run's row is locked FOR SHARE in the same transaction: a commit ending the run either came first (this
    waits for it, and the caller's read sees the run ended) or comes after this one, when its trigger, a statement
    of its own with a snapshot of its own, sees the waiter and notifies. No end falls between the two."""
    with conn.transaction():
        (waiter,) = conn.execute(_AWAIT_END[0], {"run": run_id}).fetchone()
        conn.execute(_AWAIT_END[1], {"run": run_id})
    return int(waiter)


def forget_waiter(conn: Any, waiter: int) -> None:
    """The caller stopped waiting: its run's end need not notify any more (for it)."""
    conn.execute("DELETE FROM run_waiter WHERE id = %(id)s", {"id": waiter})
