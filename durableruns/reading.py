"""What the edges read about a run, computed from the record: the plan it follows, its boundary, what this
deploy lacks for it, what it holds in other systems, and what its steps declare (policy, docstring, timeout).
Reads only: the services compose them, the admin, the API and show_run show them (through `services`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

from django.db.models import Case, DateTimeField, Exists, F, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Cast

from durableruns import conf, holdings, store
from durableruns.attributes import VALUE_LIMIT, from_record
from durableruns.boundary import Boundary, compute_boundary
from durableruns.distribution import is_distributed
from durableruns.errors import RunNotActionable, RunNotFound, UnknownWorkflow
from durableruns.holdings import Holding
from durableruns.models import Escalation, RunAttribute, RunState, RunStatus, RunStep
from durableruns.passes import step_timeout
from durableruns.plans import Plan, lacking
from durableruns.policies import Policy
from durableruns.rates import WAITING_FOR_TURN
from durableruns.registry import Step, get_workflow, workflows
from durableruns.waits import KINDS

Runs = TypeVar("Runs", bound=QuerySet[RunState])  # a queryset of runs, its own class kept (RunStateQuerySet)


def run_plan(run: RunState) -> Plan | None:
    """The plan the run started under (recorded once per fingerprint), or None where it is not recorded."""
    return store.plan_of(run.workflow, run.plan_fingerprint)


def plan_of(run: RunState) -> tuple[str, ...] | None:
    """The run's own plan's steps, whatever this deploy's plan is; None if the plan is not recorded."""
    plan = run_plan(run)
    return None if plan is None else plan.names


def boundary_of(run: RunState, rows: Iterable[RunStep] | None = None) -> Boundary:
    """The run's boundary with its status, from `rows` or the run's attempts (prefetched ones cost nothing),
    through its own plan; where that plan is not recorded, the steps in the order they were attempted."""
    attempts = [row.to_attempt() for row in (run.attempts.all() if rows is None else rows)]
    plan = plan_of(run)
    if plan is None:
        attempted = tuple(dict.fromkeys(a.step for a in sorted(attempts, key=lambda a: (a.started_at, a.attempt))))
        return replace(
            compute_boundary(attempted, attempts), status=run.status, plan_known=False, deadline=run.deadline_at
        )
    recorded = run_plan(run)
    waits = recorded.waits if recorded is not None else {}
    waits_for_turn = run.status == RunStatus.WAITING and run.reason.startswith(WAITING_FOR_TURN)
    turns = store.waiting_turns(run.run_id) if waits_for_turn else None  # no query for any other run
    debounced = run.wake_at if run.debounce_key is not None and run.reason == store.DEBOUNCED else None
    return replace(
        compute_boundary(plan, attempts, waits=waits, turns=turns),
        status=run.status,
        debounced_until=debounced,
        deadline=run.deadline_at,
    )


def lacking_of(run: RunState, b: Boundary) -> tuple[str, ...] | None:
    """The steps the run still needs that this deploy cannot run for it (None: its plan is not recorded)."""
    plan = run_plan(run)
    if plan is None:
        return None
    try:
        workflow = get_workflow(run.workflow)
    except UnknownWorkflow:
        return lacking(plan, None, b.remainder)
    if workflow.fingerprint == plan.fingerprint:
        return ()
    return lacking(plan, workflow.policies(), b.remainder)


def holdings_of(run: RunState, rows: Iterable[RunStep] | None = None, *, held_only: bool = False) -> list[Holding]:
    """What the run holds in other systems, from `rows` or its attempts (releases included); with `held_only`,
    only what it holds or may hold (what the run page, the queue, the API and show_run list). Empty for a
    workflow this deploy does not know: its acquisitions are not declared here."""
    try:
        workflow = get_workflow(run.workflow)
    except UnknownWorkflow:
        return []
    acquisitions = workflow.acquisitions()
    if not acquisitions:
        return []
    attempts = [row.to_attempt() for row in (run.attempts.all() if rows is None else rows)]
    found = holdings.assess(workflow.plan, acquisitions, attempts)
    return holdings.held(found) if held_only else found


# No hold lapses: a typed NULL, which PostgreSQL accepts in an ORDER BY (a bare NULL is "a non-integer constant",
# refused when the queue's order is inlined, as in the pks a bulk decision reads).
_NO_LAPSE = Cast(Value(None), output_field=DateTimeField())


def with_hold_lapses(escalations: QuerySet[Escalation]) -> QuerySet[Escalation]:
    """Annotate each escalation with `hold_lapses_at`: when the first hold its run still has lapses at its far
    system (completed acquisition + hold_expires_after, unless released or handed on), or None. Computed by the
    database in the same query, so the queue sorts by it across pages at no extra query."""
    if is_distributed(escalations.db):
        return _with_hold_lapses_read_apart(escalations)
    whens = []
    for workflow in workflows().values():
        for acq in workflow.acquisitions():
            if acq.hold_expires_after is None:
                continue
            gone = Q(
                Exists(RunStep.objects.filter(run_id=OuterRef("run_id"), step=acq.release_step, status="completed"))
            )
            if acq.released_by:
                gone |= Q(
                    Exists(RunStep.objects.filter(run_id=OuterRef("run_id"), step=acq.released_by, status="completed"))
                )
            whens.append(
                When(
                    Q(step=acq.step, run__workflow=workflow.name) & ~gone,
                    then=F("finished_at") + Value(acq.hold_expires_after),
                )
            )
    if not whens:
        return escalations.annotate(hold_lapses_at=_NO_LAPSE)
    lapses = (
        RunStep.objects.filter(run_id=OuterRef("run_id"), status="completed")
        .annotate(lapse=Case(*whens, output_field=DateTimeField()))
        .exclude(lapse=None)
        .order_by("lapse")
        .values("lapse")[:1]
    )
    return escalations.annotate(hold_lapses_at=Subquery(lapses, output_field=DateTimeField()))


def _with_hold_lapses_read_apart(escalations: QuerySet[Escalation]) -> QuerySet[Escalation]:
    """with_hold_lapses on a Citus cluster, where the escalations are a reference table that may not correlate a
    subquery on the distributed attempts: the escalations' runs and their attempts are read in two queries of
    their own, each run's first lapse is what its page shows (holdings.soonest_lapse), and is written into the
    query."""
    ids = set(escalations.order_by().values_list("run_id", flat=True).distinct())
    expiring = {name for name, w in workflows().items() if any(a.hold_expires_after for a in w.acquisitions())}
    runs = list(RunState.objects.filter(pk__in=ids, workflow__in=expiring)) if ids and expiring else []
    rows: dict[str, list[RunStep]] = {}
    for row in RunStep.objects.filter(run_id__in=[run.pk for run in runs]) if runs else ():
        rows.setdefault(row.run_id, []).append(row)
    whens = []
    for run in runs:
        lapse = holdings.soonest_lapse(holdings_of(run, rows.get(run.pk, []), held_only=True))
        if lapse is not None:
            whens.append(When(run_id=run.pk, then=Value(lapse)))
    if not whens:
        return escalations.annotate(hold_lapses_at=_NO_LAPSE)
    return escalations.annotate(hold_lapses_at=Case(*whens, default=Value(None), output_field=DateTimeField()))


def run_holdings(run_id: str, *, held_only: bool = False) -> list[Holding]:
    """Return what a run holds (see holdings_of)."""
    return holdings_of(get_run(run_id), held_only=held_only)


def get_run(run_id: str) -> RunState:
    try:
        return RunState.objects.get(pk=run_id)
    except RunState.DoesNotExist:
        raise RunNotFound(run_id=run_id) from None


def run_boundary(run_id: str) -> Boundary:
    """Return the recovery boundary of a run, as a resume would compute it, with the run's attributes."""
    run = get_run(run_id)
    return replace(boundary_of(run), attributes=attributes_of(run))


def attributes_of(run: RunState) -> dict[str, str | int]:
    """The run's attributes, name -> str or int, in name order (prefetched ones, prefetch_related("attributes"),
    cost nothing)."""
    rows = sorted(run.attributes.all(), key=lambda a: a.name)
    return {a.name: from_record(a.value_text, a.kind) for a in rows}


def with_attributes(runs: Runs, pairs: Iterable[tuple[str, str]]) -> Runs:
    """The runs of `runs` that have every (name, value text) of `pairs`: an exact match, an integer attribute by
    its decimal text; each pair one EXISTS through the (name, value_text) index."""
    for name, value in pairs:
        runs = runs.filter(Exists(RunAttribute.objects.filter(run_id=OuterRef("pk"), name=name, value_text=value)))
    return runs


def attribute_value_run_ids(value: str, *, limit: int = 1000) -> list[str]:
    """The ids of runs (at most `limit`) with an attribute of any name whose value text is exactly `value`: the
    admin's search, read first by run_attribute's value index, so the runs' filter is an index condition."""
    if len(value) > VALUE_LIMIT:
        return []
    rows = RunAttribute.objects.filter(value_text=value).order_by().values_list("run_id", flat=True).distinct()
    return list(rows[:limit])


def outlived_timeout(run: RunState, b: Boundary, *, now: datetime) -> str:
    """For a run held under a live lease, say if the step in hand has outlived its declared timeout by the margin
    (which thread, since when): it blocks that thread of its worker. '' otherwise. For display only: `now` is
    the page's time, no ownership is decided by it."""
    if run.status != RunStatus.RUNNING or not b.in_doubt or not run.lease_expires_at or run.lease_expires_at < now:
        return ""
    step = b.in_doubt[-1]
    since = b.latest[step].started_at
    try:
        timeout = step_timeout(get_workflow(run.workflow)[step])
    except (UnknownWorkflow, KeyError):
        return ""
    if since is None or now - since <= timeout + conf.stuck_margin():
        return ""
    age = (now - since).total_seconds()
    held = f"{age:.0f} s" if age < 120 else f"{age / 60:.0f} min"
    return (
        f"{step} has been in hand for {held} on {run.owner} (since {since:%Y-%m-%d %H:%M:%S}), past its "
        f"{timeout.total_seconds():g}s timeout"
    )


def _release_step(run: RunState, step: str) -> Step | None:
    """The release step `step` ("<acquisition>:release") as this deploy declares it with its acquisition."""
    try:
        return get_workflow(run.workflow).releaser(step)
    except UnknownWorkflow:
        return None


def step_policy(run: RunState, step: str) -> Policy | None:
    """The policy the run's own plan declares for `step`, or for a release step the one its acquisition declares
    (None: neither, or the plan is not recorded)."""
    plan = run_plan(run)
    policy = plan.policy(step) if plan else None
    if policy in KINDS:  # a step that waits has no in-doubt policy: it never acts
        return None
    if policy:
        return Policy(policy)
    release = _release_step(run, step)
    return None if release is None else release.policy


def step_doc(run: RunState, step: str) -> str:
    """The step's docstring (for an escalated step: how a person checks the far system by hand), or '': this
    deploy's function of it, where it declares the step with the policy the run's plan has."""
    release = _release_step(run, step)
    if release is not None:
        return release.doc
    try:
        declared = get_workflow(run.workflow).get(step)
    except UnknownWorkflow:
        return ""
    plan = run_plan(run)
    if declared is None or (plan.policy(step) if plan else None) != declared.kind:
        return ""
    return declared.doc


# The runs a retry gives fresh attempts: failed, or stopped for staff after the crash budget.
RETRYABLE = (RunStatus.FAILED, RunStatus.NEEDS_DECISION)


def stopped_at(run: RunState) -> tuple[str, int | None]:
    """The step a failed or stopped run stopped at (failed, or still in doubt), and its latest attempt."""
    b = boundary_of(run)
    steps = [s for s in b.remainder if s in b.failed or s in b.in_doubt]
    step = steps[0] if steps else ""
    return step, b.latest[step].attempt if step else None


def retry_point(run: RunState) -> tuple[str, int | None]:
    """Where a retry of `run` starts (stopped_at), or RunNotActionable: a run that is not failed or stopped, or
    one waiting on an open escalation (decided instead). The single retry and a bulk's both ask this."""
    if run.status not in RETRYABLE:
        raise RunNotActionable(
            f"only a failed or stopped run can be retried; this one is {run.status}",
            run_id=run.run_id,
            status=run.status,
        )
    if (
        run.status == RunStatus.NEEDS_DECISION
        and Escalation.objects.filter(run_id=run.run_id, decision__isnull=True).exists()
    ):
        raise RunNotActionable(
            "this run waits for a decision on its escalation: decide it instead of retrying",
            run_id=run.run_id,
            status=run.status,
        )
    return stopped_at(run)
