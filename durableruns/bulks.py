"""Bulk acts by filter (issue 32): one cancel, retry or restart asked once for every run a filter of GET /api/runs/
matches (or one decision for a set of escalations), recorded at once and acted on later by the workers.

`start_bulk` freezes the matching runs in one commit (store.bulks.create_bulk) and returns: nothing is acted on
in the web request. Each `resume_runs` worker takes pending items in batches (`work`), from a thread of its own
in a --loop worker (worker.bulks) or before the pass in a single pass; several share a bulk. Before acting, each
run is checked again against the whole filter, in the scope of the bulk's author, and against the act's own
precondition (cancel: not ended; retry: failed or stopped; restart: ended, with a completed result before the
step): one that no longer fits is skipped with the reason, and listed in the bulk's `failed`. Each act is the
single act's (a staff act with who = the bulk's author, when, why = its note, naming the bulk), made inside the
commit that marks its item done, so a SIGKILL anywhere leaves each run acted on exactly once in the end.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model

from durableruns import faults, signals, store
from durableruns.bulk_models import Bulk, BulkItem
from durableruns.clock import Clock
from durableruns.errors import BulkNotFound, InvalidDecision, InvalidInput, RunNotActionable
from durableruns.models import Escalation, Intervention, RunState, RunStatus
from durableruns.policies import Outcome, Policy
from durableruns.reading import RETRYABLE, retry_point, run_plan, stopped_at
from durableruns.registry import get_workflow, workflows
from durableruns.restarts import who
from durableruns.store.bulks import After, Batch, act_on_pending, bulk_progress, create_bulk
from durableruns.store.cancels import announce_cancelled
from durableruns.store.plans import record_plan
from durableruns.store.restarts import restart_in_commit
from durableruns.store.staff import already_decided, cascade_reason, decision_in_commit, staff_action_in_commit

# The acts a bulk by filter makes (POST /api/runs/bulk/), and the permission each needs: the single act's.
ACTIONS = ("cancel", "retry", "restart")
PERMISSIONS = {
    "cancel": "durableruns.cancel_run",
    "retry": "durableruns.retry_run",
    "restart": "durableruns.restart_run",
    "decide": "durableruns.decide_escalation",
}
CANCELLABLE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_DECISION, RunStatus.FAILED)
# A restart bulk with this from_step restarts each run from the step it failed at (the admin's action).
FAILED_STEP = ""


def _note(note: Any) -> str:
    if not isinstance(note, str) or not note.strip():
        raise InvalidDecision("a note saying why is required")
    return store.storable(note.strip(), limit=2000)


def start_bulk(
    action: str, filter: Mapping[str, Any], *, by: Any, note: str, from_step: str | None = None, chosen: Any = None
) -> tuple[str, int]:
    """Record a bulk `action` on every run matching `filter` (parsed as GET /api/runs/ parses its query) that
    `by` may see, frozen now; return its id and how many runs it holds. Nothing is acted on here: the workers do.

    A restart needs `from_step` (FAILED_STEP: each run from the step it failed at). `chosen` (a queryset of runs,
    the admin's "select all") replaces the filter's own query; the filter is still checked again per run.
    Permissions are the edge's to check: PERMISSIONS names each act's."""
    if action not in ACTIONS:
        raise InvalidInput(f"action must be one of {', '.join(ACTIONS)}, not {action!r}")
    decided_by, user_id = who(by)
    note = _note(note)
    if action == "restart":
        if from_step is None:
            raise InvalidInput("a restart needs from_step: the step to restart each run from")
        _check_step(from_step, filter.get("workflow") or "")
    elif from_step:
        raise InvalidInput(f"from_step goes only with restart, not {action}")
    if chosen is None:
        chosen = RunState.objects.matching(filter)
    runs = chosen.visible_to(by).values_list("run_id")
    bulk_id = f"bulk-{uuid.uuid4().hex[:16]}"
    total = create_bulk(
        bulk_id=bulk_id,
        action=action,
        chosen=runs,
        filter=dict(filter),
        note=note,
        decided_by=decided_by,
        user_id=user_id,
        from_step=from_step or "",
    )
    store.wake_workers()
    return bulk_id, total


def _check_step(from_step: str, workflow: str) -> None:
    """A restart's step must be a step of some workflow this deploy declares (of the filter's, if it names one)."""
    if from_step == FAILED_STEP:
        return
    declared = workflows()
    candidates = [declared[workflow]] if workflow in declared else list(declared.values())
    if not any(from_step in wf.as_plan().names for wf in candidates):
        where = f"{workflow}'s plan" if workflow in declared else "any declared workflow's plan"
        raise InvalidInput(f"from_step {from_step!r} is not a step of {where}", step=from_step)


def decide_in_bulk(escalation_ids: list[int], outcome: str, *, by: Any, note: str) -> tuple[str, int]:
    """Record one decision (`outcome`, `note`) for each open escalation of `escalation_ids` that `by` may see, as
    a bulk the workers act on; return its id and how many escalations it holds."""
    try:
        Outcome(outcome)
    except ValueError:
        raise InvalidDecision(f"outcome must be happened, did_not_happen or abandon, not {outcome!r}") from None
    decided_by, user_id = who(by)
    note = _note(note)
    chosen = (
        Escalation.objects.visible_to(by).open().filter(pk__in=escalation_ids).order_by().values_list("run_id", "id")
    )
    bulk_id = f"bulk-{uuid.uuid4().hex[:16]}"
    total = create_bulk(
        bulk_id=bulk_id,
        action=Bulk.Action.DECIDE,
        chosen=chosen,
        filter={},
        note=note,
        decided_by=decided_by,
        user_id=user_id,
        outcome=outcome,
    )
    store.wake_workers()
    return bulk_id, total


@dataclass(frozen=True, kw_only=True)
class Progress:
    """Where a bulk stands: `done` of `total` items taken (acted on or skipped), the skipped with their reasons."""

    bulk: Bulk
    total: int
    done: int
    failed: list[tuple[str, str]]  # (run_id, reason)

    @property
    def state(self) -> str:
        return "finished" if self.done >= self.total else "running"


def progress(bulk_id: str, *, user: Any = None) -> Progress:
    """Where the bulk `bulk_id` stands (errors.BulkNotFound if none); with `user`, only the skipped runs that user
    may see are listed."""
    try:
        bulk, done, _pending, skipped = bulk_progress(bulk_id)
    except Bulk.DoesNotExist:
        raise BulkNotFound(bulk_id=bulk_id) from None
    if user is not None and skipped:
        visible = set(
            RunState.objects.visible_to(user).filter(pk__in=[r for r, _ in skipped]).values_list("pk", flat=True)
        )
        skipped = [(r, why) for r, why in skipped if r in visible]
    return Progress(bulk=bulk, total=bulk.total, done=done, failed=skipped)


# -- the workers' side -------------------------------------------------------------------------------------------


def work(*, batch: int = 50, clock: Clock = store.DATABASE) -> Batch:
    """Act on up to `batch` pending items of any bulk, each in the commit that marks it done (store.bulks)."""
    acts = _Acts()
    return act_on_pending(acts.act, batch=batch, clock=clock, prepare=acts.prepare)


def drain(*, clock: Clock = store.DATABASE) -> int:
    """Act on every pending item no other worker holds; return how many were taken (a single pass's share)."""
    taken = 0
    while (batch := work(clock=clock)).taken:
        taken += batch.taken
    return taken


# Items this process has acted on: the crash point "bulk:N" of an act (DURABLERUNS_CRASH_AT="cancel@bulk:70"
# kills the worker inside the commit of its 70th item, the act made and not committed).
_acted = itertools.count(1)


class _Acts:
    """One batch's acts: the bulks' authors are read once per batch."""

    def __init__(self) -> None:
        self.authors: dict[str, Any] = {}
        self.fitting: set[tuple[str, str]] = set()  # (bulk_id, run_id) of the batch's runs that fit their filter

    def prepare(self, batch_bulks: dict[str, Bulk], items: list[BulkItem]) -> None:
        """Inside the batch's commit: which of its runs still match their bulk's whole filter, in the author's
        scope, one query a bulk (each act then locks its run and checks its own precondition on the record)."""
        for bulk in batch_bulks.values():
            if bulk.action == Bulk.Action.DECIDE:
                continue
            ids = [i.run_id for i in items if i.bulk_id == bulk.bulk_id]
            runs = RunState.objects.matching(bulk.filter).visible_to(self.author(bulk)).filter(pk__in=ids)
            self.fitting.update((bulk.bulk_id, run_id) for run_id in runs.values_list("pk", flat=True))

    def author(self, bulk: Bulk) -> Any:
        if bulk.bulk_id not in self.authors:
            user = get_user_model()._default_manager.filter(pk=bulk.user_id).first() if bulk.user_id else None
            self.authors[bulk.bulk_id] = user  # None: an author no longer there sees no scoped workflow
        return self.authors[bulk.bulk_id]

    def act(self, bulk: Bulk, item: BulkItem, now: datetime) -> After | None:
        then = self._act(bulk, item, now)
        faults.reached(f"bulk:{next(_acted)}", bulk.action)
        return then

    def _act(self, bulk: Bulk, item: BulkItem, now: datetime) -> After | None:
        if bulk.action == Bulk.Action.DECIDE:
            return _decide(bulk, item, now, self.author(bulk))
        if (bulk.bulk_id, item.run_id) not in self.fitting:
            raise RunNotActionable("it no longer matches the bulk's filter", run_id=item.run_id)
        if bulk.action == Bulk.Action.CANCEL:
            return _cancel(bulk, item, now)
        if bulk.action == Bulk.Action.RETRY:
            return _retry(bulk, item, now)
        return _restart(bulk, item, now)


def _cancel(bulk: Bulk, item: BulkItem, now: datetime) -> After:
    act, cancelled = staff_action_in_commit(
        item.run_id,
        action=Intervention.Action.CANCEL,
        allowed_from=CANCELLABLE,
        new_status=RunStatus.CANCELLED,
        decided_by=bulk.decided_by,
        user_id=bulk.user_id,
        note=bulk.note,
        now=now,
        bulk_id=bulk.bulk_id,
    )

    def after() -> None:  # as services.cancel_run announces it
        signals.escalation_was_decided(act)
        signals.run_finished(
            item.run_id, RunStatus.CANCELLED, reason=f"cancel by {bulk.decided_by}: {bulk.note}", by=bulk.decided_by
        )
        announce_cancelled(
            cancelled, reason=cascade_reason(item.run_id, bulk.decided_by, bulk.note), by=bulk.decided_by
        )

    return after


def _retry(bulk: Bulk, item: BulkItem, now: datetime) -> After | None:
    # As services.retry_run: read, then the act locks the run and checks its status again (a failed or stopped
    # run's attempts do not move meanwhile: no claim takes it).
    run = RunState.objects.get(pk=item.run_id)
    step, attempt = retry_point(run)
    staff_action_in_commit(
        run.run_id,
        action=Intervention.Action.RETRY,
        allowed_from=RETRYABLE,
        new_status=RunStatus.PENDING,
        decided_by=bulk.decided_by,
        user_id=bulk.user_id,
        note=bulk.note,
        now=now,
        step=step,
        attempt=attempt,
        bulk_id=bulk.bulk_id,
    )
    return None


def _restart(bulk: Bulk, item: BulkItem, now: datetime) -> After | None:
    """As durableruns.restart: a new run, keys kept, the resolvable steps the source attempted looked up first."""
    source = RunState.objects.get(pk=item.run_id)
    workflow = get_workflow(source.workflow)
    from_step = bulk.from_step
    if from_step == FAILED_STEP:
        from_step, _attempt = stopped_at(source)
        if source.status != RunStatus.FAILED or not from_step:
            raise RunNotActionable(
                f"this run has no failed step to restart from; it is {source.status}",
                run_id=source.run_id,
                status=source.status,
            )
    plan = workflow.as_plan()
    record_plan(plan)  # joins this commit
    restart_in_commit(
        source.run_id,
        run_id=f"{workflow.name}-{uuid.uuid4().hex[:12]}",
        plan=plan,
        from_step=from_step,
        resolvable=[s.name for s in workflow.steps if s.policy is Policy.RESOLVABLE and s.wait is None],
        acquisitions=[(a.step, a.release_step) for a in workflow.acquisitions()],
        concurrency_key=workflow.limit_key(source.input),
        decided_by=bulk.decided_by,
        user_id=bulk.user_id,
        note=bulk.note,
        now=now,
        bulk_id=bulk.bulk_id,
    )
    return None


def _decide(bulk: Bulk, item: BulkItem, now: datetime, author: Any) -> After:
    """One escalation of a decision bulk, as services.resolve_escalation decides it (no result: a decision in
    bulk records none)."""
    escalation = (
        Escalation.objects.visible_to(author)
        .select_for_update(of=("self",))
        .select_related("run")
        .filter(pk=item.escalation_id, run_id=item.run_id)  # the run named: on a Citus cluster, one shard to lock
        .first()
    )
    if escalation is None:
        raise RunNotActionable("the escalation is gone, or out of the author's scope", run_id=item.run_id)
    if Intervention.objects.filter(escalation_id=escalation.pk).exists():
        raise already_decided(escalation.pk)
    cursor = None
    if bulk.outcome == Outcome.HAPPENED:
        plan = run_plan(escalation.run)
        names = plan.names if plan is not None else ()
        cursor = names.index(escalation.step) + 1 if escalation.step in names else escalation.run.cursor + 1
    decision, cancelled, cascade = decision_in_commit(
        escalation.pk,
        action=bulk.outcome,
        decided_by=bulk.decided_by,
        user_id=bulk.user_id,
        note=bulk.note,
        result=None,
        cursor=cursor,
        now=now,
        bulk_id=bulk.bulk_id,
        superuser=bool(getattr(author, "is_superuser", False)),  # an inbox item another holds: an override
    )

    def after() -> None:  # as services.resolve_escalation announces it
        signals.escalation_was_decided(decision)
        if bulk.outcome == Outcome.ABANDON:
            signals.run_finished(
                decision.run_id,
                RunStatus.CANCELLED,
                reason=f"abandoned by {bulk.decided_by}: {bulk.note}",
                by=bulk.decided_by,
            )
        announce_cancelled(cancelled, reason=cascade, by=bulk.decided_by)

    return after
