"""A run's deadline: `Workflow(deadline=, on_deadline=)` and `start(..., deadline=)`, counted from the start on
the database's clock (run_state.deadline_at, written by the INSERT itself), and what happens once it passes.

A run past its deadline that has not ended ends `cancelled` or `failed` (as recorded at its start), its reason
naming the deadline ("deadline of 3 days passed at 2026-12-07 14:00:00 UTC"), as a staff cancel ends it: its
unfinished descendants are cancelled, what it holds is given back by a worker first (durableruns.releasing), a
worker inside a step is fenced out by the epoch bump; the act is recorded as a system act (no user, the reason
as its note). Who ends it:

- the worker whose claim takes it past its deadline (the claim reads deadline_at <= now(): Claimed.overdue); a
  run waiting (a sleep, an event, an approval, a join, even a wait with no timeout) wakes at its deadline, since
  its wake time is the earlier of the two (the trigger of migration 0026), so a claim takes it then;
- for a run no claim will take (leased by a worker inside a long step, stopped for staff), the sweep each
  worker's watchdog makes every few seconds (sweep()).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from durableruns import signals, store
from durableruns.clock import Clock
from durableruns.errors import InvalidInput
from durableruns.models import RunStatus
from durableruns.passes import RunOutcome
from durableruns.registry import Workflow
from durableruns.store import Claimed, Overdue
from durableruns.store.cancels import SYSTEM_ACTOR
from durableruns.store.deadlines import REASON_PREFIX

log = logging.getLogger("durableruns")

FINAL = {"cancel": RunStatus.CANCELLED, "fail": RunStatus.FAILED}


def at_start(
    workflow: Workflow, deadline: timedelta | datetime | None
) -> tuple[timedelta | datetime | None, str | None]:
    """The deadline a run of `workflow` starts with, and what it ends as then: start's `deadline` (a positive
    timedelta from the start, or an aware datetime), else the workflow's own; (None, None) for none. A naive
    datetime, a timedelta that is not positive, or anything else is InvalidInput."""
    if deadline is None:
        deadline = workflow.deadline
    elif isinstance(deadline, timedelta):
        if deadline <= timedelta(0):
            raise InvalidInput(f"deadline must be a positive timedelta, not {deadline!r}")
    elif isinstance(deadline, datetime):
        if deadline.tzinfo is None or deadline.tzinfo.utcoffset(deadline) is None:
            raise InvalidInput(f"deadline must be an aware datetime, not the naive {deadline.isoformat()}")
    else:
        raise InvalidInput(f"deadline must be a timedelta or an aware datetime, not {type(deadline).__name__}")
    return (None, None) if deadline is None else (deadline, workflow.on_deadline)


def span_text(span: timedelta) -> str:
    """A deadline's span in words, its two largest units: '3 days', '1 hour 30 minutes', '5 seconds'."""
    seconds = max(0, round(span.total_seconds()))
    parts = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}{'' if count == 1 else 's'}")
    return " ".join(parts[:2]) or "0 seconds"


def reason(overdue: Overdue) -> str:
    """Why the run ended: 'deadline of 3 days passed at 2026-12-07 14:00:00 UTC'."""
    at = overdue.deadline_at.astimezone(UTC)
    span = span_text(overdue.deadline_at - overdue.created_at)
    return f"{REASON_PREFIX}{span} passed at {at:%Y-%m-%d %H:%M:%S %Z}"


def end(overdue: Overdue, *, epoch: int | None = None, clock: Clock = store.DATABASE) -> store.Ended | None:
    """End one run past its deadline (store.end_at_deadline), and announce it once committed."""
    said = reason(overdue)
    final = FINAL.get(overdue.on_deadline, RunStatus.CANCELLED)
    ended = store.end_at_deadline(overdue.run_id, final=final, reason=said, epoch=epoch, clock=clock)
    if ended is None:
        return None
    log.info("run %s: %s; it ends %s", overdue.run_id, said, final)
    # A cancel is announced at the act (as a staff cancel is); a failure once it is one (store.end, after the
    # releases, announces it when a worker gave back what the run held).
    if final == RunStatus.CANCELLED or ended.status == RunStatus.FAILED:
        signals.run_finished(overdue.run_id, final, reason=said, by=SYSTEM_ACTOR)
    return ended


def end_claimed(claimed: Claimed, clock: Clock) -> RunOutcome:
    """The engine's move for a run its claim took past its deadline: end it under the claim's epoch, and let go of
    the lease at once (this worker is inside no step)."""
    lease = claimed.lease
    overdue = store.overdue_of(lease.run_id)
    ended = None if overdue is None else end(overdue, epoch=lease.epoch, clock=clock)
    if overdue is None or ended is None:  # moved on meanwhile (a staff act, another worker): not this worker's
        return RunOutcome(run_id=lease.run_id, status="fenced_out", detail="its deadline passed; ended elsewhere")
    store.let_go(lease)
    detail = reason(overdue)
    if ended.status == RunStatus.PENDING:
        detail += ": it gives back what it holds first"
    return RunOutcome(run_id=lease.run_id, status=ended.status, detail=detail)


def sweep(*, clock: Clock = store.DATABASE, limit: int = 100) -> list[str]:
    """End the runs past their deadline that no claim will take (store.unclaimable_overdue): a run leased by a
    worker inside a long step (fenced out), one stopped for staff. Return those ended; any number of processes
    may sweep at once (the act locks the run, and one finding it ended already does nothing)."""
    ended = []
    for overdue in store.unclaimable_overdue(clock=clock, limit=limit):
        if end(overdue, clock=clock) is not None:
            ended.append(overdue.run_id)
    return ended
