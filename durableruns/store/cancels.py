"""How a run that ends unfinished sets its status, and the cancel of a cancelled run's unfinished descendants: what
a staff act and a worker's own ending share. Each function runs inside its caller's commit."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from durableruns import conf, signals
from durableruns.clock import Clock
from durableruns.encoding import storable
from durableruns.errors import UnknownWorkflow
from durableruns.holdings import RELEASE_SUFFIX, assess, needs_releasing
from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from durableruns.registry import get_workflow
from durableruns.store.base import Lease, wake_workers

# Who the cancel the engine makes of a cancelled run's descendants is recorded as (run_intervention.decided_by).
SYSTEM_ACTOR = "durableruns"


def ending_fields(run_id: str, final: str, *, release: str = "") -> dict[str, Any]:
    """How a staff act that ends a run unfinished sets its status: `final` at once when the run holds nothing
    a worker must give back, else pending with `ending` = `final` (a worker releases, then sets it). Staff act
    outside a worker: the releases are effects, and never run in a web request or inside this transaction.

    Abandoning the escalation of a release itself (`release` names a release step) gives up on that release
    only: the run stays ending, a worker goes on with the other releases and then ends it, and its holdings
    still list the abandoned hold (nobody pretends it is gone)."""
    current = RunState.objects.filter(pk=run_id).values_list("workflow", "ending").get()
    workflow_name, ending = current
    if ending and release.endswith(RELEASE_SUFFIX):
        return {"status": RunStatus.PENDING}
    try:
        workflow = get_workflow(workflow_name)
    except UnknownWorkflow:
        return {"status": final, "ending": ""}
    acquisitions = workflow.acquisitions()
    if not acquisitions:
        return {"status": final, "ending": ""}
    attempts = [row.to_attempt() for row in RunStep.objects.filter(run_id=run_id)]
    if needs_releasing(assess(workflow.plan, acquisitions, attempts)):
        return {"status": RunStatus.PENDING, "ending": final}
    return {"status": final, "ending": ""}


def staff_act(fields: dict[str, Any], pending: Escalation | None) -> Intervention:
    """Record a staff act on a run, closing its open escalation `pending` with it if a decision has not."""
    if pending is not None:
        try:
            with transaction.atomic(using=conf.database()):  # a decision may have won the escalation meanwhile
                return Intervention.objects.create(escalation=pending, **dict(
                    fields, step=pending.step, attempt=pending.attempt))
        except IntegrityError:
            pass
    return Intervention.objects.create(**fields)


def descendants(run_id: str) -> list[str]:
    """The run's children, then their children, and so on: breadth first, by the parent index."""
    found: list[str] = []
    frontier = [run_id]
    while frontier:
        frontier = list(RunState.objects.filter(parent_id__in=frontier).order_by("run_id")
                        .values_list("run_id", flat=True))
        found.extend(frontier)
    return found


def cancel_descendants(run_id: str, *, reason: str, decided_by: str, user_id: int | None, now: datetime,
                       seen: set[str] | None = None) -> list[str]:
    """Inside the commit that ends the run `run_id` cancelled, or begins its ending so (every path: a staff
    cancel, an abandon, a rejected approval, a wait's cancel): cancel each of its unfinished descendants as a
    staff cancel of it would, its reason naming the ancestor; return those cancelled, for the caller to signal
    once its commit is made (announced_cancelled).

    Called before the ancestor's own row is locked: a child's row is locked before its parent's, the order a
    child's own end takes them (wake_parent, for the last child), so they never deadlock. A descendant is
    recorded under its parent's row lock (start_child and record_result fence on the parent), so once a row is
    locked here no child of it can be added; the descendants are read again until a reading finds none not yet
    seen, which takes in a grandchild recorded before its parent's row was locked. `seen` carries what an earlier
    call took in: a caller reads again after it locks the ancestor (a child recorded before that lock)."""
    seen = set() if seen is None else seen
    cancelled: list[str] = []
    while True:
        fresh = [child for child in descendants(run_id) if child not in seen]
        if not fresh:
            return cancelled
        for child in reversed(fresh):  # the deepest first
            seen.add(child)
            if _cancel_child(child, reason=reason, decided_by=decided_by, user_id=user_id, now=now):
                cancelled.append(child)


def announce_cancelled(children: list[str], *, reason: str, by: str) -> None:
    """Send run_finished for descendants a commit just cancelled (after it: receivers read a committed record)."""
    for child in children:
        signals.run_finished(child, RunStatus.CANCELLED, reason=storable(reason), by=by)


def _cancel_child(run_id: str, *, reason: str, decided_by: str, user_id: int | None, now: datetime) -> bool:
    """Inside the cancel of an ancestor: cancel its descendant `run_id` if it is unfinished and not being
    cancelled already, as a staff cancel of it would (its open escalation closed, what it holds given back by a
    worker first, its worker fenced out by the epoch bump); False if it had ended, or ends cancelled already."""
    pending = (Escalation.objects.select_for_update(of=("self",))
               .filter(run_id=run_id, decision__isnull=True).first())
    if RunState.objects.select_for_update().filter(pk=run_id).unfinished().exclude(
            ending=RunStatus.CANCELLED).values_list("pk", flat=True).first() is None:
        return False
    fields = ending_fields(run_id, RunStatus.CANCELLED)
    # Its lease is left as it is (record_staff_action says why): a limited child holds its slot until its worker,
    # fenced out, lets go or that lease runs out.
    RunState.objects.filter(pk=run_id).update(epoch=F("epoch") + 1, wake_at=None, updated_at=now,
                                              reason=storable(reason), **fields)
    if fields["status"] == RunStatus.PENDING:
        wake_workers()  # a worker gives back what it holds, then ends it cancelled
    staff_act({"run_id": run_id, "step": "", "attempt": None, "action": Intervention.Action.CANCEL,
               "decided_by": decided_by, "user_id": user_id, "decided_at": now, "note": storable(reason)}, pending)
    return True


def cancel_with(lease: Lease, *, reason: str, clock: Clock) -> tuple[list[str], str]:
    """Inside a worker's commit that ends its run cancelled (or begins its ending so): cancel its unfinished
    descendants first, each act recorded as decided by SYSTEM_ACTOR, the reason naming the run and why. Returns
    those cancelled and the reason, for announce_cancelled after the commit."""
    said = f"cancelled with {lease.run_id}: {reason}"
    return cancel_descendants(lease.run_id, reason=said, decided_by=SYSTEM_ACTOR, user_id=None,
                              now=clock.now()), said
