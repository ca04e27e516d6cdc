"""A run's own plan, and the rules that hold it against whatever code a worker happens to run. Pure: no Django.

A run records the fingerprint of the plan it started under; the plan itself (step names and policies, in order)
is recorded once per fingerprint (store.record_plan), so that every reader (boundary, admin, API, show_run, the
engine) sees the run through the plan it started under, never through the plan of the reader's deploy. The
current code only supplies the functions for those steps, by name, and only where it declares them with the
same policy: a step declared with another policy is, for this run, a step this deploy lacks.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from durableruns.errors import PlanMismatch
from durableruns.waits import KINDS

# (step name, policy value), in plan order; a wait step has its kind (durableruns.waits.Kind) for a policy.
PlanSteps = tuple[tuple[str, str], ...]


def fingerprint_of(steps: Iterable[tuple[str, str]]) -> str:
    """Hash the ordered step names and policies (the same hash Workflow.fingerprint has always recorded)."""
    shape = [[name, policy] for name, policy in steps]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A recorded plan. `workflow` is the workflow it was first recorded for (two workflows with the same steps
    share a fingerprint, and so a plan)."""

    fingerprint: str
    workflow: str
    steps: PlanSteps

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.steps)

    @property
    def waits(self) -> dict[str, str]:
        """The plan's wait steps, name -> kind (sleep, wait_for, approval)."""
        return {name: kind for name, kind in self.steps if kind in KINDS}

    def policy(self, step: str) -> str | None:
        return dict(self.steps).get(step)

    def describe(self) -> str:
        return ", ".join(f"{name} ({policy})" for name, policy in self.steps)


def lacking(plan: Plan, have: Mapping[str, str] | None, needed: Collection[str]) -> tuple[str, ...]:
    """The steps of `plan` among `needed` that this deploy cannot run for it, in plan order: absent from `have`
    (this deploy's step name -> policy; None when the deploy lacks the whole workflow), or declared there with
    another policy (the run's in-doubt attempts must be settled by the policy they were recorded under)."""
    return tuple(name for name, policy in plan.steps if name in needed and (have is None or have.get(name) != policy))


# -- waiting for a deploy that has the steps -----------------------------------------------------------------

# The reasons below are what the record says about such a run; the time in the waiting reason is the database's
# clock when a worker first found the run lacking, from which the grace period runs.
WAITING_MARK = "waiting for a deploy that has "
STOPPED_MARK = "stopped for staff: this deploy lacks "
_SINCE = re.compile(r"\(lacking since (\S+)\)$")


def _what(fingerprint: str, plan: Plan | None, missing: Sequence[str], workflow: str | None) -> str:
    if plan is None:
        return f"the run's plan {fingerprint} (not recorded, and not this deploy's)"
    if workflow is not None:
        return f"workflow {workflow!r} (the run's plan {fingerprint}: {plan.describe()})"
    return f"{', '.join(missing)} of the run's plan {fingerprint} ({plan.describe()})"


def waiting_reason(
    *, fingerprint: str, plan: Plan | None, missing: Sequence[str], since: datetime, workflow: str | None = None
) -> str:
    """The reason of a run left for a worker whose deploy has its steps (or, naming `workflow`, the workflow this
    deploy lacks altogether); it carries when the run was first seen lacking them."""
    return f"{WAITING_MARK}{_what(fingerprint, plan, missing, workflow)} (lacking since {since.isoformat()})"


def stopped_reason(
    *, fingerprint: str, plan: Plan | None, missing: Sequence[str], grace: timedelta, workflow: str | None = None
) -> str:
    """The reason of a run stopped after the grace period: what is missing, and what staff can do."""
    return (
        f"{STOPPED_MARK}{_what(fingerprint, plan, missing, workflow)}, for more than {_seconds(grace)}: deploy "
        f"it again (the next resume_runs of that deploy works the run), adopt the current plan, or cancel"
    )


def lacking_since(reason: str) -> datetime | None:
    """When the run was first found lacking steps, if its reason says it is waiting for them."""
    if not reason.startswith(WAITING_MARK):
        return None
    found = _SINCE.search(reason)
    if found is None:
        return None
    try:
        return datetime.fromisoformat(found.group(1))
    except ValueError:
        return None


def after_lacking(*, since: datetime, now: datetime, grace: timedelta, retry: timedelta) -> datetime | None:
    """When to look at a lacking run again (a short wait, never past the end of the grace period), or None once
    the grace period is over: the run then stops for staff."""
    ends = since + grace
    if now >= ends:
        return None
    return min(now + retry, ends)


def _seconds(span: timedelta) -> str:
    total = int(span.total_seconds())
    if total % 3600 == 0 and total:
        return f"{total // 3600} h"
    if total % 60 == 0 and total:
        return f"{total // 60} min"
    return f"{span.total_seconds():g} s"


# -- adopting the current plan -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Misfit:
    """Why a run's record does not fit a plan, and the step that does not."""

    step: str
    reason: str


def misfit(*, attempted: Sequence[str], policies: Mapping[str, str] | None, new: PlanSteps) -> Misfit | None:
    """Whether a run that attempted `attempted` (in order) may move to the plan `new`; None when it may.

    It may where every attempted step is in `new`, in the same relative order, with the policy it was attempted
    under (`policies`, from the run's plan; None when that plan is not recorded), and no step it has not
    attempted comes before its last attempted step (that step would be skipped).
    """
    index = {name: i for i, (name, _) in enumerate(new)}
    declared = dict(new)
    previous: str | None = None
    for step in attempted:
        if step not in index:
            return Misfit(step=step, reason=f"{step} was attempted, and the new plan has no {step}")
        recorded = (policies or {}).get(step)
        if recorded is not None and recorded != declared[step]:
            return Misfit(
                step=step, reason=f"{step} was attempted as {recorded}, and the new plan declares it {declared[step]}"
            )
        if previous is not None and index[step] < index[previous]:
            return Misfit(
                step=step, reason=f"{step} was attempted after {previous}, and the new plan puts it before {previous}"
            )
        previous = step
    if previous is None:
        return None
    tried = set(attempted)
    for name, _ in new[: index[previous]]:
        if name not in tried:
            return Misfit(
                step=name,
                reason=f"{name} comes before {previous} in the new plan, and was never attempted: it would be skipped",
            )
    return None


def check_fit(
    run_id: str, *, attempted: Sequence[str], policies: Mapping[str, str] | None, new: PlanSteps, new_fingerprint: str
) -> None:
    """Raise PlanMismatch, naming the step, unless the run's record fits the plan `new`."""
    found = misfit(attempted=attempted, policies=policies, new=new)
    if found is not None:
        raise PlanMismatch(
            f"run {run_id} cannot adopt plan {new_fingerprint}: {found.reason}",
            run_id=run_id,
            step=found.step,
            plan=new_fingerprint,
        )


def attempted_in_order(plan: Plan | None, attempts: Iterable[tuple[str, datetime | None]]) -> list[str]:
    """The steps a run attempted, each once, in the order it attempted them: its plan's order where the plan is
    recorded (the engine follows it), else the order of their first attempts' start."""
    starts: dict[str, datetime | None] = {}
    for step, started in attempts:
        seen = starts.get(step, started)
        starts[step] = started if seen is None or (started is not None and started < seen) else seen
    if plan is not None:
        ordered = [name for name in plan.names if name in starts]
        return ordered + [s for s in starts if s not in ordered]
    return sorted(starts, key=lambda s: (starts[s] is None, starts[s] or datetime.min, s))
