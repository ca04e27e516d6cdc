"""What staff do to runs: escalations opened for them and their decisions, cancels (with a run's unfinished
descendants) and retries, and a run moved to another plan; each one commit, the epoch bump fencing its worker."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from durableruns import conf, signals
from durableruns.boundary import compute_boundary
from durableruns.clock import Clock
from durableruns.encoding import storable
from durableruns.errors import AlreadyDecided, FencedOut, RunNotActionable, RunNotFound
from durableruns.models import Escalation, Intervention, Resolution, RunState, RunStatus, RunStep, StepStatus
from durableruns.plans import Plan, attempted_in_order, check_fit
from durableruns.store.base import DATABASE, ENDED, Lease, wake_workers
from durableruns.store.cancels import announce_cancelled, cancel_descendants, ending_fields, staff_act
from durableruns.store.children import wake_parent
from durableruns.store.inbox import Opening, guard_decision, open_item
from durableruns.store.plans import plan_of, record_plan


def open_escalation(lease: Lease, *, step: str, attempt: int, effect_key: str, in_doubt_since: datetime | None,
                    reason: str, inbox: Opening | None = None, clock: Clock = DATABASE) -> None:
    """Stop the run for a person: the escalation, its inbox item (assigned as `inbox` says; by default to
    DURABLERUNS_DEFAULT_ASSIGNEE) and the run's needs_decision status in one commit."""
    reason = storable(reason)
    with transaction.atomic(using=conf.database(), durable=True):
        moved = RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(
            status=RunStatus.NEEDS_DECISION, reason=reason, wake_at=None, lease_expires_at=None,
            updated_at=clock.expression()
        )
        if not moved:
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        escalation, created = Escalation.objects.get_or_create(
            run_id=lease.run_id,
            step=step,
            attempt=attempt,
            defaults={"effect_key": effect_key, "in_doubt_since": in_doubt_since or clock.expression(),
                      "opened_at": clock.expression(), "reason": reason},
        )
        if created:
            open_item(run_id=lease.run_id, step=step, attempt=attempt, kind="escalation", escalation=escalation,
                      opening=inbox or Opening(group=conf.default_assignee()), clock=clock)
    if created:  # signals
        signals.send_on_commit(signals.escalation_opened, Escalation, escalation_id=escalation.pk,
                               run_id=lease.run_id, step=step, attempt=attempt, reason=reason)


def record_decision(
    escalation_id: int,
    *,
    action: str,
    decided_by: str,
    user_id: int | None,
    note: str,
    result: Any,
    cursor: int | None,
    superuser: bool = False,
    clock: Clock = DATABASE,
) -> Intervention:
    """Apply a staff decision once: the decision row, its effect on the attempt, and a resumable run, in one commit.

    The one-to-one between decision and escalation is what makes a second, concurrent decision fail. A decision
    by anyone but the holder of the escalation's inbox item raises ItemTaken, recording nothing (a superuser's
    is recorded as an override).
    """
    try:
        with transaction.atomic(using=conf.database(), durable=True):
            decision, cancelled, cascade = decision_in_commit(
                escalation_id, action=action, decided_by=decided_by, user_id=user_id, note=note, result=result,
                cursor=cursor, now=clock.now(), superuser=superuser, clock=clock)
        announce_cancelled(cancelled, reason=cascade, by=decided_by)
        return decision
    except IntegrityError:
        raise already_decided(escalation_id) from None


def already_decided(escalation_id: int) -> AlreadyDecided:
    """The refusal of a second decision: it names who decided first, and when."""
    first = Intervention.objects.select_related(None).get(escalation_id=escalation_id)
    return AlreadyDecided(
        f"already decided by {first.decided_by} at {first.decided_at:%Y-%m-%d %H:%M:%S}: "
        f"{first.get_action_display()}",
        escalation_id=escalation_id,
        decided_by=first.decided_by,
        decided_at=first.decided_at,
    )


def decision_in_commit(
    escalation_id: int,
    *,
    action: str,
    decided_by: str,
    user_id: int | None,
    note: str,
    result: Any,
    cursor: int | None,
    now: datetime,
    bulk_id: str | None = None,
    superuser: bool = False,
    clock: Clock = DATABASE,
) -> tuple[Intervention, list[str], str]:
    """Inside the caller's commit (record_decision's, or a bulk item's): the decision of record_decision, made at
    `now`; return it, the descendants an abandon cancelled and the reason they were given (to announce once
    committed). A second decision raises IntegrityError (the one-to-one), which the caller answers."""
    cancelled: list[str] = []
    cascade = ""
    escalation = Escalation.objects.select_for_update().get(pk=escalation_id)
    status = RunState.objects.filter(pk=escalation.run_id).values_list("status", flat=True).get()
    if status != RunStatus.NEEDS_DECISION and not Intervention.objects.filter(
        escalation_id=escalation_id
    ).exists():
        raise RunNotActionable(
            f"the run is {status}, not waiting for a decision", run_id=escalation.run_id, status=status
        )
    guard_decision(run_id=escalation.run_id, step=escalation.step, attempt=escalation.attempt,
                   decided_by=decided_by, user_id=user_id, superuser=superuser, now=now)
    decision = Intervention.objects.create(
        run_id=escalation.run_id, escalation=escalation, step=escalation.step,
        attempt=escalation.attempt, action=action, decided_by=decided_by, user_id=user_id,
        decided_at=now, note=note, result=result, bulk_id=bulk_id,
    )
    run_fields: dict[str, Any] = {"updated_at": now, "wake_at": None, "epoch": F("epoch") + 1}
    if action == Intervention.Action.HAPPENED:
        RunStep.objects.filter(
            run_id=escalation.run_id, step=escalation.step, attempt=escalation.attempt,
            status=StepStatus.STARTED,
        ).update(status=StepStatus.COMPLETED, result=result, finished_at=now,
                 resolution=Resolution.DECISION)
        run_fields.update(status=RunStatus.PENDING, cursor=cursor, reason=f"{decided_by}: it happened")
    elif action == Intervention.Action.DID_NOT_HAPPEN:
        run_fields.update(status=RunStatus.PENDING, reason=f"{decided_by}: it did not happen, run again")
    else:
        ending = ending_fields(escalation.run_id, RunStatus.CANCELLED, release=escalation.step)
        if RunStatus.CANCELLED in (ending["status"], ending.get("ending")):  # not a release's abandon
            # Its descendants before its own row (cancel_descendants says why): none of them goes on.
            cascade = f"abandoned by {decided_by} with {escalation.run_id}: {note}"
            cancelled = cancel_descendants(escalation.run_id, reason=cascade, decided_by=decided_by,
                                           user_id=user_id, now=now)
        run_fields.update(reason=f"abandoned by {decided_by}: {note}", **ending)
    RunState.objects.filter(pk=escalation.run_id).update(**run_fields)
    if run_fields["status"] == RunStatus.PENDING:
        wake_workers()
    elif run_fields["status"] in ENDED:
        wake_parent(escalation.run_id, clock)
    return decision, cancelled, cascade


def record_staff_action(
    run_id: str,
    *,
    action: str,
    allowed_from: tuple[str, ...],
    new_status: str,
    decided_by: str,
    user_id: int | None,
    note: str,
    step: str = "",
    attempt: int | None = None,
    clock: Clock = DATABASE,
) -> Intervention:
    """Cancel or retry a run: the staff act and the status change in one commit; the epoch bump fences its worker.

    A cancel also closes the run's open escalation, if any, so the queue does not keep asking about a run
    nobody will resume. Locks are taken escalation first, then run, the order record_decision uses.
    """
    with transaction.atomic(using=conf.database(), durable=True):
        act, cancelled = staff_action_in_commit(
            run_id, action=action, allowed_from=allowed_from, new_status=new_status, decided_by=decided_by,
            user_id=user_id, note=note, step=step, attempt=attempt, now=clock.now(), clock=clock)
    announce_cancelled(cancelled, reason=cascade_reason(run_id, decided_by, note), by=decided_by)  # once committed
    return act


def cascade_reason(run_id: str, decided_by: str, note: str) -> str:
    """The reason a staff cancel gives the run's descendants it cancels with it."""
    return f"cancel by {decided_by} with {run_id}: {note}"


def staff_action_in_commit(
    run_id: str,
    *,
    action: str,
    allowed_from: tuple[str, ...],
    new_status: str,
    decided_by: str,
    user_id: int | None,
    note: str,
    now: datetime,
    step: str = "",
    attempt: int | None = None,
    bulk_id: str | None = None,
    clock: Clock = DATABASE,
) -> tuple[Intervention, list[str]]:
    """Inside the caller's commit (record_staff_action's, or a bulk item's): the act of record_staff_action, made
    at `now`; return it and the descendants a cancel cancelled with it (to announce once committed)."""
    cancelled: list[str] = []
    seen: set[str] = set()
    cascade = cascade_reason(run_id, decided_by, note)
    pending = None
    if action == Intervention.Action.CANCEL:
        # Its unfinished descendants first, the deepest first (cancel_descendants says why that order).
        cancelled += cancel_descendants(run_id, reason=cascade, decided_by=decided_by, user_id=user_id, now=now,
                                        seen=seen)
        pending = (Escalation.objects.select_for_update(of=("self",))
                   .filter(run_id=run_id, decision__isnull=True).first())
    run = RunState.objects.select_for_update().filter(pk=run_id).first()
    if run is not None and action == Intervention.Action.CANCEL:
        # A child recorded between that reading and this lock (its insert held the parent's row, which this
        # waited for) is in the record now, and no other can be added: read again, and cancel it too.
        cancelled += cancel_descendants(run_id, reason=cascade, decided_by=decided_by, user_id=user_id, now=now,
                                        seen=seen)
    if run is None:
        raise RunNotFound(run_id=run_id)
    if run.status not in allowed_from:
        raise RunNotActionable(
            f"cannot {action} a run that is {run.status}", run_id=run_id, status=run.status
        )
    if action == Intervention.Action.CANCEL and run.ending == RunStatus.CANCELLED:
        # Already being cancelled (by a cancel or an abandon): a worker is giving back what it holds. A
        # second act would be a second record of the same decision.
        raise RunNotActionable(
            f"the run is already being cancelled ({run.reason}): a worker is giving back what it holds",
            run_id=run_id, status=run.status,
        )
    status_fields: dict[str, Any] = {"status": new_status}
    if action == Intervention.Action.CANCEL:
        status_fields = ending_fields(run_id, new_status)
        new_status = status_fields["status"]
    # The lease is left as it is: a running run's worker may be inside a far call until it lets go (fenced
    # out, store.runs.let_go) or that lease runs out, and a limited run holds its slot until then (claims).
    RunState.objects.filter(pk=run_id).update(
        epoch=F("epoch") + 1, wake_at=None, updated_at=now,
        reason=f"{action} by {decided_by}: {note}", **status_fields,
    )
    if new_status == RunStatus.PENDING:
        wake_workers()
    elif new_status in ENDED and run_id not in cancelled:
        wake_parent(run_id, clock)
    fields: dict[str, Any] = {"run_id": run_id, "step": step, "attempt": attempt, "action": action,
                              "decided_by": decided_by, "user_id": user_id, "decided_at": now, "note": note,
                              "bulk_id": bulk_id}
    return staff_act(fields, pending), cancelled


def adopt_plan(
    run_id: str,
    *,
    plan: Plan,
    allowed_from: tuple[str, ...],
    decided_by: str,
    user_id: int | None,
    note: str,
    clock: Clock = DATABASE,
) -> Intervention:
    """Move a run to `plan` on purpose: the fit check, the new fingerprint and the staff act in one commit.

    The fit is checked on the record as it is under the run's row lock, of a run no worker holds (its status in
    `allowed_from`, or running under a lease that ran out), so no attempt can be added between the check and the
    move. The epoch bump fences whoever
    held it before; the run is pending, and the next pass follows `plan`.
    """
    with transaction.atomic(using=conf.database(), durable=True):
        now = clock.now()
        run = RunState.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise RunNotFound(run_id=run_id)
        # A run whose worker died (running, its lease run out) is held by nobody, as a waiting one is.
        abandoned = run.status == RunStatus.RUNNING and (run.lease_expires_at is None or run.lease_expires_at < now)
        if run.status not in allowed_from and not abandoned:
            raise RunNotActionable(f"cannot adopt_plan for a run that is {run.status} (held by {run.owner})"
                                   if run.status == RunStatus.RUNNING else
                                   f"cannot adopt_plan for a run that is {run.status}", run_id=run_id,
                                   status=run.status)
        if run.plan_fingerprint == plan.fingerprint:
            raise RunNotActionable(f"the run follows plan {plan.fingerprint} already", run_id=run_id,
                                   status=run.status)
        old = plan_of(run.workflow, run.plan_fingerprint)
        attempts = [row.to_attempt() for row in RunStep.objects.of_run(run_id)]
        check_fit(run_id, attempted=attempted_in_order(old, [(a.step, a.started_at) for a in attempts]),
                  policies=dict(old.steps) if old else None, new=plan.steps, new_fingerprint=plan.fingerprint)
        record_plan(plan, clock=clock)
        remainder = compute_boundary(plan.names, attempts).remainder
        RunState.objects.filter(pk=run_id).update(
            plan_fingerprint=plan.fingerprint, status=RunStatus.PENDING, epoch=F("epoch") + 1, wake_at=None,
            lease_expires_at=None, updated_at=now,
            cursor=plan.names.index(remainder[0]) if remainder else len(plan.names),
            reason=storable(f"adopt_plan by {decided_by}: {note} (plan {run.plan_fingerprint} -> {plan.fingerprint})"),
        )
        wake_workers()
        return Intervention.objects.create(
            run_id=run_id, action=Intervention.Action.ADOPT_PLAN, decided_by=decided_by, user_id=user_id,
            decided_at=now, note=note,
            result={"from_plan": run.plan_fingerprint, "to_plan": plan.fingerprint,
                    "from_steps": [list(s) for s in old.steps] if old else None,
                    "to_steps": [list(s) for s in plan.steps]},
        )
