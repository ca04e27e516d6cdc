"""One pass over one claimed run, as every room that moves it shares it: the pass's state (Pass), how it ended
(RunOutcome), the signal that ends it early (Stop), and what a kind's room may ask of the engine that drives it
(Driver).

Below the engine and below the rooms of the step kinds that record moves for it (durableruns.waiting for the
steps that wait, durableruns.releasing for the releases of what a run holds): each can be read without the other.
"""

from __future__ import annotations

import copy
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import connections

from durableruns import conf, plans, waits
from durableruns.boundary import Boundary, StepAttempt
from durableruns.clock import Clock
from durableruns.context import StepContext
from durableruns.encoding import storable
from durableruns.errors import EffectInTransaction, UnknownWorkflow
from durableruns.held import Held, may_hold
from durableruns.holdings import acquisition_round, last_completed, round_key
from durableruns.models import Intervention, RunStep
from durableruns.plans import Plan
from durableruns.policies import Next, Policy, crash_looped
from durableruns.registry import Step, Workflow, effect_key
from durableruns.store import Claimed, Intent, Lease, NewChild


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """How one pass over a run ended: the run's status afterwards and a line for the operator."""

    run_id: str
    status: str
    detail: str
    steps_run: int = 0
    wake_at: datetime | None = None  # when a run left waiting comes due again (the database's clock)


def ensure_autocommit() -> None:
    """Refuse to act inside a transaction on the runs' database: a rollback after a real charge would erase the
    evidence of it."""
    db = connections[conf.database()]
    if db.in_atomic_block or not db.get_autocommit():
        raise EffectInTransaction()


_ATTEMPT_FIELDS = (
    "step",
    "attempt",
    "status",
    "effect_key",
    "started_at",
    "finished_at",
    "renewed_at",
    "held_until",
    "raised_at",
    "loop_cursor",
    "progress",
    "result",
    "error",
)


def load_attempts(run_id: str) -> list[StepAttempt]:
    """Every attempt of the run, in one query (plain values: this runs once per claim)."""
    return [StepAttempt(**row) for row in RunStep.objects.of_run(run_id).values(*_ATTEMPT_FIELDS)]


@dataclass
class Pass:
    """The mutable state of one pass over one run."""

    claimed: Claimed
    steps: list[Step]  # the run's own plan, with this deploy's functions
    workflow: Workflow  # this deploy's declaration: its acquisitions' releases (durableruns.releasing)
    boundary: Boundary
    results: dict[str, Any] = field(default_factory=dict)
    steps_run: int = 0
    finished: bool = False  # the last result commit also completed the run
    # The attempt in hand's last committed loop position and progress: where a new attempt continues.
    loop_cursor: int = 0
    progress: dict[str, Any] = field(default_factory=dict)
    # The attempt number from which each step's attempts count again after a staff retry; read on first need.
    _floors: dict[str, int] | None = None
    # Per step, since its floor: [observed failures, ends in doubt], from the record, then counted in the pass.
    _tally: dict[str, list[int]] = field(default_factory=dict)
    attempts: list[StepAttempt] = field(default_factory=list)
    # The child runs the attempt in hand asked for, recorded with its result (a re_executable step's).
    children: dict[str, NewChild] = field(default_factory=dict)
    # The attributes the attempt in hand set (ctx.set_attributes), recorded with its result.
    attributes: dict[str, Any] = field(default_factory=dict)
    # Results of steps that recorded no intent, waiting for the next commit (durableruns.held), and when the first
    # of them was started (time.monotonic()).
    held: list[Held] = field(default_factory=list)
    held_since: float = 0.0

    def tally(self, step: str) -> list[int]:
        """[failures, crashes] of `step` since staff last gave it a fresh count; the pass adds to it in place."""
        counts = self._tally.get(step)
        if counts is None:  # since staff's fresh count, or since it last completed (an acquisition made again)
            floor = max(self.floor(step), last_completed(self.attempts, step))
            mine = [a for a in self.attempts if a.step == step and a.attempt > floor]
            counts = self._tally[step] = [
                sum(a.status == "failed" for a in mine),
                sum(a.status == "started" for a in mine),
            ]
        return counts

    def next_attempt(self, step: Step) -> int:
        """The number of `step`'s next attempt, after every one the record and this pass hold."""
        return 1 + max((a.attempt for a in self.attempts if a.step == step.name), default=0)

    def context(self, step: Step, attempt: int) -> StepContext:
        """What users' code asked about `step` before it acts sees (its when=, a sleep's time): no checkpoint."""
        return StepContext(
            run_id=self.run_id,
            step=step.name,
            input=self.claimed.input,
            results=self.results,
            effect_key=effect_key(self.key_base, step.name),
            attempt=attempt,
            timeout=step_timeout(step),
        )

    @property
    def plan_names(self) -> tuple[str, ...]:
        """The run's own plan, by step name."""
        return tuple(step.name for step in self.steps)

    def floor(self, step: str) -> int:
        if self._floors is None:
            self._floors = {}
            for name, attempt in Intervention.objects.filter(
                run_id=self.run_id, action=Intervention.Action.RETRY
            ).values_list("step", "attempt"):
                self._floors[name] = max(self._floors.get(name, 0), attempt or 0)
        return self._floors.get(step, 0)

    @property
    def lease(self) -> Lease:
        return self.claimed.lease

    @property
    def run_id(self) -> str:
        return self.claimed.lease.run_id

    @property
    def key_base(self) -> str:
        """The run id its steps' effect keys are named after: its own, or a restart's original (restarts.py)."""
        return self.claimed.key_run_id or self.claimed.lease.run_id


class Stop(Exception):
    """The pass ends here with this outcome (the run was released, fenced out, or handed to staff): raised by
    whichever room made the move, caught by the engine's one loop."""

    def __init__(self, outcome: RunOutcome) -> None:
        self.outcome = outcome


def step_timeout(step: Step) -> timedelta:
    """The step's declared timeout; zero is a declaration too, only None falls back to the default."""
    return conf.default_timeout() if step.timeout is None else step.timeout


def describe(exc: BaseException) -> str:
    """What a step's exception says, as the record keeps it (cut to 2,000 characters)."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return storable(text, limit=2000)


class Driver(Protocol):
    """What the room of a step kind asks of the engine that drives the pass: the moves every kind shares. The
    room records its own moves in the store and raises Stop when one ends the pass; the engine stays the one loop
    over the plan."""

    clock: Clock

    def release(self, lease: Lease, status: str, reason: str, wake_at: datetime | None = None) -> RunOutcome:
        """Hand the run back (waiting until `wake_at`, pending, or stopped) and say so."""
        ...

    def end_unfinished(self, state: Pass, ending: str, reason: str, *, stopped: str = "") -> RunOutcome:
        """End the run as `ending`, first giving back what it holds."""
        ...

    def look_up(self, state: Pass, step: Step, attempt: StepAttempt) -> Next:
        """Ask the step's lookup what became of an in-doubt attempt; its verdict."""
        ...

    def call(self, state: Pass, step: Step, intent: Intent) -> tuple[Any, str]:
        """Run the step under its recorded intent; its result and the result's JSON."""
        ...

    def asking(self, state: Pass, step: Step, index: int, ask: Callable[[], Any], raised: str = ...) -> Any:
        """Ask users' code a question about `step` before it acts; a raise is the step's observed failure."""
        ...


def stopped_reason(
    claimed: Claimed, plan: Plan | None, missing: tuple[str, ...], *, workflow: str | None = None
) -> str:
    """Why a run lacking steps is stopped for staff once the grace period is over."""
    return plans.stopped_reason(
        fingerprint=claimed.plan_fingerprint,
        plan=plan,
        missing=missing,
        grace=conf.missing_step_grace(),
        workflow=workflow,
    )


def crash_loop(claimed: Claimed, boundary: Boundary) -> str:
    """Why the run stops for staff before this pass begins (policies.crash_looped), or "": only where nothing it
    recorded is in doubt, since an attempt in doubt is counted against the crash budget as it is settled."""
    if boundary.in_doubt or not boundary.remainder:
        return ""
    return crash_looped(takeovers=claimed.takeovers, max_crashes=conf.max_crashes(), step=boundary.remainder[0])


def done_elsewhere(name: str, policy: str) -> Step:
    """A step of the run's plan that this deploy no longer declares, which the run completed: it stands in the
    plan for its place, and is never called (the pass skips done steps)."""

    def absent(ctx: StepContext) -> Any:
        raise UnknownWorkflow(f"step {name} is not in this deploy", step=name)

    if policy in waits.KINDS:
        return Step(
            name=name, fn=absent, policy=Policy.RE_EXECUTABLE, intent=False, wait=waits.Wait(kind=waits.Kind(policy))
        )
    return Step(name=name, fn=absent, policy=Policy(policy))


def fails(step: Step, exc: Exception) -> bool:
    """Whether what the step raised is an observed failure: a declared rejection, or any error of a step that may
    run again. Anything else leaves the attempt in doubt."""
    return step.is_rejection(exc) or step.policy is Policy.RE_EXECUTABLE


def fresh_intent(state: Pass, step: Step, index: int, *, attempt: int, restored: StepAttempt | None = None) -> Intent:
    key = effect_key(state.key_base, step.name)
    if step.releaser is not None:  # an acquisition made again after it was given back has a key of its own
        key = round_key(key, acquisition_round(step.acquisition(), state.attempts))
    return Intent(
        step=step.name,
        attempt=attempt,
        effect_key=key,
        cursor=index,
        loop_cursor=restored.loop_cursor if restored else 0,
        progress=copy.deepcopy(dict(restored.progress)) if restored else None,
        wait_for_standby=step.waits_for_standby,
    )


def intent_after(state: Pass, plan: list[Step], index: int) -> Intent | None:
    """The next step's intent, to share this result's commit, when it starts right away with no history."""
    if index + 1 >= len(plan):
        return None
    nxt = plan[index + 1]
    if (
        not nxt.intent
        or nxt.name in state.boundary.latest
        or nxt.wait is not None
        or nxt.when is not None
        or nxt.rate is not None
    ):  # a rate-limited step takes its turn before its intent
        return None
    return fresh_intent(state, nxt, index + 1, attempt=1)


def held_for(state: Pass, plan: list[Step], index: int, began: float, *, stopping: bool) -> Intent | None:
    """The next step's intent, unrecorded, when the result of the step just returned waits for the next
    commit (durableruns.held.may_hold); None when it is committed now."""
    if index + 1 >= len(plan) or state.children or state.attributes or stopping:
        return None
    following = plan[index + 1]
    since = state.held_since if state.held else began
    if not may_hold(
        plan[index],
        following,
        fresh=following.name not in state.boundary.latest,
        held=len(state.held),
        age=time.monotonic() - since,
        window=conf.hold_results(),
    ):
        return None
    state.held_since = since
    return fresh_intent(state, following, index + 1, attempt=1)
