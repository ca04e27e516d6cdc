"""Workflows and their steps as declared in Python, and the registry that finds them by name. No database.

A workflow's plan is its steps in declaration order; its fingerprint (ordered names and policies) is recorded
with each run, and the plan itself once per fingerprint (durableruns.plans): a run follows the plan it started
under, and a deploy supplies the functions of its steps by name.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Collection, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from durableruns import attributes as run_attributes
from durableruns.errors import DeclarationError, InvalidInput, UnknownWorkflow
from durableruns.holdings import Acquisition, release_step
from durableruns.plans import Plan, PlanSteps, fingerprint_of
from durableruns.policies import Policy
from durableruns.rates import parse_rate
from durableruns.steps import LookupFn, Step, StepFn, WhenFn
from durableruns.waits import Kind, OnChildFailure, OnReject, OnTimeout, Wait

if TYPE_CHECKING:
    from durableruns.context import StepContext

_registry: dict[str, Workflow] = {}
_changes = 0  # bumped by every declaration, so what is derived from the registry is derived again
FirstSteps = tuple[tuple[str, str, str], ...]  # (workflow, plan fingerprint, first step) each
_first_steps: tuple[int, FirstSteps] = (-1, ())
# The most characters a workflow's or a step's name may have: the record stores them in columns of this length
# (run_state.workflow and run_plan.workflow; run_step.step, run_escalation.step and run_intervention.step, a
# release under "<step>:release"). A longer name would be refused by the database in a worker's pass, run after
# run; it is refused here, at import, instead (and checks.py holds this to the models' columns).
NAME_LIMIT = 200


class Workflow:
    """A named, ordered plan of steps; `@workflow.step(policy=...)` adds one.

    A name belongs to one module. A second declaration of the name from another module is refused (runs started
    under the first would otherwise execute the second's code); from the same module (the module imported again,
    as tests and reloads do) it replaces the first. `replace=True` says a module means to replace a workflow
    declared elsewhere: another deploy of the same flow, loaded in its own worker process by a test.

    `concurrency=N`: at most N runs of the workflow hold a lease at once, across every worker and host; with
    `concurrency_key=lambda input: ...`, at most N (default 1) per key, the key asked once at start and recorded.

    `deadline=timedelta(...)`: each run must have ended that long after its start (the database's clock), or it
    ends as `on_deadline` says, "cancel" (the default) or "fail" (durableruns.deadlines).

    `internal=True`: the workflow is started only by the code that declares it, which passes the Workflow itself
    (`services.start_run(..., internal=workflow)`). Every other way in (`durableruns.start`, the API, a child run,
    a schedule) refuses it as it refuses a name nobody declared (UnknownWorkflow), and no list of what can be
    started names it (startable_workflows()); the engine, the admin and the readers of its runs still find it
    (get_workflow). The Tasks backend's "durableruns.task" is one: its input names code to call.
    """

    def __init__(self, name: str, *, replace: bool = False, concurrency: int | None = None,
                 concurrency_key: Callable[[dict[str, Any]], Any] | None = None, internal: bool = False,
                 deadline: timedelta | None = None, on_deadline: str = "cancel",
                 attributes: dict[str, run_attributes.Source] | None = None) -> None:
        if not name or not isinstance(name, str):
            raise DeclarationError("a workflow needs a non-empty name")
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                        or concurrency < 1):
            raise DeclarationError(f"workflow {name!r}: concurrency must be a positive whole number, not "
                                   f"{concurrency!r}", workflow=name)
        if concurrency_key is not None and not callable(concurrency_key):
            raise DeclarationError(f"workflow {name!r}: concurrency_key must be a function of the run's input, not "
                                   f"{concurrency_key!r}", workflow=name)
        if len(name) > NAME_LIMIT:
            raise DeclarationError(f"workflow {name[:40]!r}... has a {len(name)}-character name: the record "
                                   f"stores at most {NAME_LIMIT}", workflow=name)
        self.name = name
        self.attributes = run_attributes.declare(name, attributes)  # {name: input key | function of the input}
        self.internal = bool(internal)
        # At most `concurrency` runs hold a lease at once: of the workflow, or per key with `concurrency_key`
        # (1 by default there). The key is asked once, at start, and recorded on the run (run_state.
        # concurrency_key); the limit itself is this deploy's, read by every claim (durableruns.store.claims).
        self.concurrency = concurrency if concurrency is not None else (1 if concurrency_key is not None else None)
        self.concurrency_key = concurrency_key
        # A run must have ended `deadline` after its start (the database's clock), or it ends as `on_deadline` says
        # (durableruns.deadlines); start(deadline=) sets one run's instead.
        if deadline is not None and (not isinstance(deadline, timedelta) or deadline <= timedelta(0)):
            raise DeclarationError(f"workflow {name!r}: deadline must be a positive timedelta, not {deadline!r}",
                                   workflow=name)
        if on_deadline not in ("cancel", "fail"):
            raise DeclarationError(f"workflow {name!r}: on_deadline must be 'cancel' or 'fail', not {on_deadline!r}",
                                   workflow=name)
        self.deadline, self.on_deadline = deadline, on_deadline
        self.module = _declaring_module(self)
        self.steps: list[Step] = []
        self._by_name: dict[str, Step] = {}
        earlier = _registry.get(name)
        if earlier is not None and earlier.module != self.module and not replace:
            raise DeclarationError(
                f"workflow {name!r} is declared twice: in {earlier.module} and in {self.module}. Runs started "
                f"under one would execute the other's steps: rename one (a run records its workflow's name), "
                f"or pass replace=True where the replacement is meant",
                workflow=name, modules=(earlier.module, self.module))
        _registry[name] = self
        _declared()

    def __repr__(self) -> str:
        return f"<Workflow {self.name}: {' -> '.join(self.plan)}>"

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def step(
        self,
        *,
        policy: str | Policy,
        lookup: LookupFn | None = None,
        lookup_lag: timedelta = timedelta(0),
        timeout: timedelta | None = None,
        max_attempts: int = 3,
        fails_on: tuple[type[BaseException], ...] | type[BaseException] = (),
        intent: bool = True,
        release: StepFn | None = None,
        release_lookup: LookupFn | None = None,
        hold_expires_after: timedelta | None = None,
        released_by: str = "",
        wait_for_standby: bool = False,
        when: WhenFn | None = None,
        rate: str | None = None,
        rate_key: Callable[[StepContext], Any] | None = None,
        assign_to: str | Callable[[StepContext], Any] | None = None,
        due: timedelta | None = None,
        escalate_to: str = "",
    ) -> Callable[[StepFn], StepFn]:
        """Declare the decorated function as the next step; `policy` is required, there is no default.

        With `release=` the step is an acquisition: a run that ends unfinished gives it back by calling `release`
        (a step named "<step>:release" with its own effect key, re_executable unless `release_lookup=` makes it
        resolvable). `hold_expires_after` is how long the far system keeps the hold on its own; `released_by`
        names a later step whose completion gives it back (or consumes it) in the normal course.
        `wait_for_standby=True`: with DURABLERUNS_STANDBY_INTENTS set, the step's intent commit waits for a
        synchronous standby, as an escalate step's always does (for a step whose effect has no key to absorb a
        second call). `when=`, a function of ctx asked once when the run reaches the step: False records the
        step skipped (its result None). `rate="N/s" | "N/m" | "N/h"`: across every worker and host, at most N
        attempts of the step start in any window of that length (per key, with `rate_key=`, a function of ctx
        asked once per attempt); a run over the limit waits for its turn holding nothing (durableruns.rates).
        `assign_to=`, `due=`, `escalate_to=`: an escalation of the step as an inbox item (durableruns.inbox).
        """
        try:
            chosen = Policy(policy)
        except ValueError:
            raise DeclarationError(
                f"{self.name}: policy must be one of {', '.join(p.value for p in Policy)}, not {policy!r}"
            ) from None
        if chosen is Policy.RESOLVABLE and lookup is None:
            raise DeclarationError(f"{self.name}: a resolvable step needs lookup=, a function of ctx")
        if not intent and chosen is not Policy.RE_EXECUTABLE:
            raise DeclarationError(f"{self.name}: only a re_executable step may skip its intent commit")
        if max_attempts < 1:
            raise DeclarationError(f"{self.name}: max_attempts must be at least 1")
        rejections = fails_on if isinstance(fails_on, tuple) else (fails_on,)
        if release is None and (release_lookup is not None or hold_expires_after is not None or released_by):
            raise DeclarationError(f"{self.name}: release_lookup=, hold_expires_after= and released_by= "
                                   f"describe an acquisition: declare its release= too")
        if hold_expires_after is not None and hold_expires_after <= timedelta(0):
            raise DeclarationError(f"{self.name}: hold_expires_after must be positive")
        _check_when(self.name, when)
        limit = None if rate is None else parse_rate(rate, where=self.name)
        if rate_key is not None and (limit is None or not callable(rate_key)):
            raise DeclarationError(f"{self.name}: rate_key= must be a function of ctx, with a rate= to count under")
        _check_inbox(self.name, assign_to, due, escalate_to)

        def register(fn: StepFn) -> StepFn:
            name = fn.__name__
            longest = release_step(name) if release is not None else name
            if len(longest) > NAME_LIMIT:
                raise DeclarationError(
                    f"{self.name}: step {name[:40]!r}... is {len(longest)} characters long as recorded "
                    f"({longest[:20]!r}...): the record stores a step's name in at most {NAME_LIMIT}",
                    workflow=self.name, step=name)
            if name in self._by_name:
                raise DeclarationError(f"{self.name}: step {name!r} is declared twice")
            if released_by and released_by in self._by_name:
                raise DeclarationError(f"{self.name}: {name} is released_by {released_by!r}, which comes before it")
            releaser = None
            if release is not None:
                releaser = Step(
                    name=release_step(name),
                    fn=release,
                    policy=Policy.RESOLVABLE if release_lookup is not None else Policy.RE_EXECUTABLE,
                    lookup=release_lookup,
                    timeout=timeout,
                    max_attempts=max_attempts,
                    fails_on=rejections,
                )
            step = Step(
                name=name,
                fn=fn,
                policy=chosen,
                lookup=lookup,
                lookup_lag=lookup_lag,
                timeout=timeout,
                max_attempts=max_attempts,
                fails_on=rejections,
                intent=intent,
                releaser=releaser,
                hold_expires_after=hold_expires_after,
                released_by=released_by,
                wait_for_standby=wait_for_standby,
                when=when,
                rate=limit,
                rate_key=rate_key,
                assign_to=assign_to,
                due=due,
                escalate_to=escalate_to,
            )
            self._add(step)
            return fn

        return register

    def _add(self, step: Step) -> None:
        if step.name in self._by_name:
            raise DeclarationError(f"{self.name}: step {step.name!r} is declared twice")
        self.steps.append(step)
        _declared()
        self._by_name[step.name] = step

    # -- steps that wait (durableruns.waits) ---------------------------------------------------------------

    def sleep(self, name: str, duration: timedelta | Callable[[StepContext], timedelta] | None = None, *,
              until: Callable[[StepContext], Any] | None = None, when: WhenFn | None = None) -> None:
        """Declare a step that waits: `duration` (a timedelta, or a function of ctx returning one) or `until` (a
        function of ctx returning an aware datetime), exactly one. The wake time is computed once, on the
        database's clock, and recorded; ctx.results[name] is {"until": "<ISO 8601>"}."""
        if (duration is None) == (until is None):
            raise DeclarationError(f"{self.name}.{name}: a sleep takes a duration or until=, exactly one")
        if isinstance(duration, timedelta):
            _positive(self.name, name, "duration", duration)
        elif duration is not None and not callable(duration):
            raise DeclarationError(f"{self.name}.{name}: duration must be a timedelta or a function of ctx")
        if until is not None and not callable(until):
            raise DeclarationError(f"{self.name}.{name}: until= must be a function of ctx returning a datetime")
        _check_when(self.name, when)
        self._add(Step(name=_wait_name(self.name, name), fn=_waits(name), policy=Policy.RE_EXECUTABLE,
                       intent=False, when=when, wait=Wait(kind=Kind.SLEEP), sleep_for=duration, sleep_until=until))

    def wait_for(self, name: str, *, event: str | None = None, timeout: timedelta | None = None,
                 on_timeout: str = "fail", when: WhenFn | None = None) -> None:
        """Declare a step that waits for an event sent to the run (durableruns.send; `event` defaults to `name`).
        ctx.results[name] is its payload. After `timeout` (from when the wait began, on the database's clock)
        `on_timeout` says: "fail" the run, "escalate" to staff, or "continue" with None."""
        chosen = _choice(self.name, name, "on_timeout", on_timeout, OnTimeout)
        if timeout is not None:
            _positive(self.name, name, "timeout", timeout)
        elif chosen is not OnTimeout.FAIL:
            raise DeclarationError(f"{self.name}.{name}: on_timeout={on_timeout!r} needs a timeout=")
        if event is not None and (not isinstance(event, str) or not event):
            raise DeclarationError(f"{self.name}.{name}: event must be a non-empty name")
        _check_when(self.name, when)
        wait = Wait(kind=Kind.WAIT_FOR, event=event or name, timeout=timeout, on_timeout=chosen)
        self._add(Step(name=_wait_name(self.name, name), fn=_waits(name), policy=Policy.RE_EXECUTABLE,
                       intent=False, when=when, wait=wait))

    def approval(self, name: str, *, when: WhenFn | None = None, timeout: timedelta | None = None,
                 on_timeout: str = "escalate", on_reject: str = "cancel", doc: str = "",
                 assign_to: str | Callable[[StepContext], Any] | None = None, due: timedelta | None = None,
                 escalate_to: str = "") -> None:
        """Declare a step that waits for a person with durableruns.decide_approval to approve or reject it
        (durableruns.decide(run_id, name, "approve" | "reject", by=..., note=...)). ctx.results[name] is
        {"approved": bool, "by": ..., "note": ..., "at": ...}. A rejection with on_reject="cancel" ends the run
        cancelled; "continue" goes on. `doc` tells staff what to check before deciding. `assign_to` (a group's
        name, or a function of ctx returning one, asked once when the wait begins), `due` (a timedelta from then,
        on the database's clock) and `escalate_to` (the group it moves to once overdue by `due` again) make it an
        assigned item of the inbox (durableruns.inbox)."""
        _check_inbox(f"{self.name}.{name}", assign_to, due, escalate_to)
        timing_out = _choice(self.name, name, "on_timeout", on_timeout, OnTimeout)
        rejecting = _choice(self.name, name, "on_reject", on_reject, OnReject)
        if timeout is not None:
            _positive(self.name, name, "timeout", timeout)
        _check_when(self.name, when)
        wait = Wait(kind=Kind.APPROVAL, timeout=timeout, on_timeout=timing_out, on_reject=rejecting)
        self._add(Step(name=_wait_name(self.name, name), fn=_waits(name, doc), policy=Policy.RE_EXECUTABLE,
                       intent=False, when=when, wait=wait, assign_to=assign_to, due=due, escalate_to=escalate_to))

    def join(self, name: str, *, timeout: timedelta | None = None, on_timeout: str = "fail",
             on_child_failure: str = "fail") -> None:
        """Declare a step that waits, holding no worker, until every child run this run started (ctx.start_run)
        has ended. ctx.results[name] maps each child's run_id to {"status": ..., "results": {step: result}}.
        `on_child_failure`: "fail" (the run fails, its reason naming the child) or "continue". After `timeout`
        (from when the join began, on the database's clock) `on_timeout` says: "fail" the run, or "continue"
        with the children as they stand. A child stopped for staff holds the join until it is decided."""
        timing_out = _choice(self.name, name, "on_timeout", on_timeout, OnTimeout)
        if timing_out is OnTimeout.ESCALATE:
            raise DeclarationError(f"{self.name}.{name}: a join's on_timeout is fail or continue (staff act on "
                                   f"the child runs themselves)")
        failing = _choice(self.name, name, "on_child_failure", on_child_failure, OnChildFailure)
        if timeout is not None:
            _positive(self.name, name, "timeout", timeout)
        elif timing_out is not OnTimeout.FAIL:
            raise DeclarationError(f"{self.name}.{name}: on_timeout={on_timeout!r} needs a timeout=")
        wait = Wait(kind=Kind.JOIN, timeout=timeout, on_timeout=timing_out, on_child_failure=failing)
        self._add(Step(name=_wait_name(self.name, name), fn=_waits(name), policy=Policy.RE_EXECUTABLE,
                       intent=False, wait=wait))

    @property
    def plan(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    @property
    def plan_steps(self) -> PlanSteps:
        """The plan as a run records it: (step name, policy), in order."""
        return self.as_plan().steps

    @property
    def fingerprint(self) -> str:
        """Hash the ordered step names and policies: the plan a run started now records (durableruns.plans)."""
        return self.as_plan().fingerprint

    @property
    def limited(self) -> bool:
        """Whether runs of this workflow are bounded by a concurrency limit."""
        return self.concurrency is not None

    def limit_key(self, input: dict[str, Any]) -> str | None:
        """The key a run started now with `input` records for its limit: None for an unlimited workflow, "" for a
        limit on the whole workflow, else str() of what `concurrency_key(input)` returns. An input the key
        function cannot read (it raises) is InvalidInput: the run is not started."""
        if self.concurrency is None:
            return None
        if self.concurrency_key is None:
            return ""
        try:
            return str(self.concurrency_key(input))
        except Exception as exc:
            raise InvalidInput(
                f"workflow {self.name}: its concurrency_key cannot be read from this input "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def attributes_of(self, input: dict[str, Any]) -> dict[str, Any]:
        """The declared attributes a run started now with `input` records; InvalidInput names one that fails."""
        return run_attributes.asked(self.name, self.attributes, input) if self.attributes else {}

    def as_plan(self) -> Plan:
        """This deploy's plan of the workflow; computed again only after a step is declared (steps are only ever
        appended), since every start and every claim asks for it."""
        cached = self.__dict__.get("_plan")
        if cached is None or cached[0] != len(self.steps):
            steps = tuple((s.name, s.kind) for s in self.steps)
            cached = self.__dict__["_plan"] = (len(self.steps), Plan(
                fingerprint=fingerprint_of(steps), workflow=self.name, steps=steps))
        plan: Plan = cached[1]
        return plan

    def policies(self) -> dict[str, str]:
        """This deploy's step name -> policy: what it can run of a recorded plan (plans.lacking)."""
        return {s.name: s.kind for s in self.steps}

    def get(self, name: str) -> Step | None:
        return self._by_name.get(name)

    def acquisitions(self) -> tuple[Acquisition, ...]:
        """The plan's acquisitions as the pure holdings rules take them."""
        return tuple(s.acquisition() for s in self.steps if s.releaser is not None)

    def releaser(self, name: str) -> Step | None:
        """The release step named `name` ("<step>:release"), if one of this plan's acquisitions declares it."""
        for s in self.steps:
            if s.releaser is not None and s.releaser.name == name:
                return s.releaser
        return None

    def describe(self) -> str:
        return ", ".join(f"{s.name} ({s.kind})" for s in self.steps)

    def __getitem__(self, name: str) -> Step:
        return self._by_name[name]


def get_workflow(name: str) -> Workflow:
    """Return the registered workflow of that name."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownWorkflow(_unknown(name, _registry), workflow=name) from None


def workflows() -> dict[str, Workflow]:
    """Return every registered workflow by name, internal ones included (what the engine and readers of runs need)."""
    return dict(_registry)


def startable_workflows() -> dict[str, Workflow]:
    """Return every registered workflow a caller may start by name: internal ones left out."""
    return {name: wf for name, wf in _registry.items() if not wf.internal}


def startable(workflow: Workflow | str, *, internal: Workflow | None = None, hidden: Collection[str] = ()
              ) -> Workflow:
    """Return the registered workflow a caller asks to start (a Workflow or its name).

    An internal workflow is refused exactly as a name nobody declared is (UnknownWorkflow, the same message,
    listing only what may be started): a caller learns nothing of it. It is found only when `internal` is that
    very Workflow object, which only the code that declares it holds. The workflows named in `hidden` (those out
    of a user's scope, durableruns.scopes) are refused and left out of the message the same way."""
    name = workflow.name if isinstance(workflow, Workflow) else workflow
    found = _registry.get(name) if isinstance(name, str) else None
    if (found is not None and found.name not in hidden
            and (not found.internal or (internal is not None and internal is found))):
        return found
    known = {n: wf for n, wf in startable_workflows().items() if n not in hidden}
    raise UnknownWorkflow(_unknown(name, known), workflow=name)


# Modules of workflows that raised DeclarationError at import (module -> message): durableruns.discovery records
# them, system check E030 reports them, and an unknown workflow's message names them.
_not_loaded: dict[str, str] = {}


def record_not_loaded(module: str, message: str) -> None:
    """Record that `module` did not load, and forget what it declared before its error: nothing half declared runs."""
    _not_loaded[module] = message
    for name in [name for name, workflow in _registry.items() if workflow.module == module]:
        del _registry[name]
    _declared()


def not_loaded() -> dict[str, str]:
    """Module -> the DeclarationError that stopped it loading, for each module of workflows that did not load."""
    return dict(_not_loaded)


def _unknown(name: object, known: dict[str, Workflow]) -> str:
    """UnknownWorkflow's message: the names known, and when that may be why, what did not load or where to look."""
    message = f"no workflow named {name!r} is registered (known: {', '.join(sorted(known)) or 'none'})"
    if _not_loaded:
        failed = "; ".join(f"{module} did not load: {why}" for module, why in sorted(_not_loaded.items()))
        return f"{message}. {failed} (manage.py check reports it: durableruns.E030)"
    if not known:
        return (f"{message}. No workflows.py declared one: it must be a module of an app in INSTALLED_APPS (not "
                f"of the project package beside settings.py; manage.py check warns of one outside, "
                f"durableruns.W005), or be named in DURABLERUNS_WORKFLOW_MODULES")
    return message


_limits: tuple[int, dict[str, int]] = (-1, {})


def limits() -> dict[str, int]:
    """Workflow name -> its concurrency limit, for every registered workflow that has one: what a claim bounds
    (the limit is this deploy's; the key each run counts under was recorded when it started)."""
    global _limits
    if _limits[0] != _changes:
        _limits = (_changes, {wf.name: wf.concurrency for wf in _registry.values() if wf.concurrency is not None})
    return _limits[1]


def first_steps() -> FirstSteps:
    """(workflow, plan fingerprint, first step) of each registered workflow whose first step records an intent:
    what a claim needs to record a fresh run's first intent in its own commit."""
    global _first_steps
    if _first_steps[0] != _changes:
        _first_steps = (_changes, tuple((wf.name, wf.fingerprint, wf.steps[0].name)
                                        for wf in _registry.values() if wf.steps and _intent_first(wf.steps[0])))
    return _first_steps[1]


def _intent_first(step: Step) -> bool:
    """Whether a fresh run's first intent may ride on its claim: a step that acts at once (not one that waits,
    nor one whose `when=` must be asked first, nor one that takes a turn under its rate limit first)."""
    return step.intent and step.wait is None and step.when is None and step.rate is None


def _wait_name(workflow: str, name: str) -> str:
    if not name or not isinstance(name, str):
        raise DeclarationError(f"{workflow}: a wait step needs a non-empty name")
    return name


def _waits(name: str, doc: str = "") -> StepFn:
    """The function a wait step stands on: never called (the engine asks durableruns.waits instead); its
    docstring is the step's doc."""

    def waits(ctx: StepContext) -> Any:
        raise DeclarationError(f"{name} is a step that waits; it is never called")

    waits.__name__ = waits.__qualname__ = name
    waits.__doc__ = doc
    return waits


def _positive(workflow: str, name: str, what: str, value: Any) -> None:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise DeclarationError(f"{workflow}.{name}: {what} must be a positive timedelta, not {value!r}")


def _choice(workflow: str, name: str, what: str, value: str, choices: type[enum.StrEnum]) -> Any:
    try:
        return choices(value)
    except ValueError:
        raise DeclarationError(f"{workflow}.{name}: {what} must be one of {', '.join(c.value for c in choices)}, "
                               f"not {value!r}") from None


def _check_inbox(where: str, assign_to: Any, due: Any, escalate_to: Any) -> None:
    if assign_to is not None and not callable(assign_to) and (not isinstance(assign_to, str) or not assign_to
                                                              or len(assign_to) > 150):
        raise DeclarationError(f"{where}: assign_to= must be a group's name or a function of ctx, not {assign_to!r}")
    if due is not None and (not isinstance(due, timedelta) or due <= timedelta(0)):
        raise DeclarationError(f"{where}: due= must be a positive timedelta, not {due!r}")
    if not isinstance(escalate_to, str) or len(escalate_to) > 150 or (escalate_to and due is None):
        raise DeclarationError(f"{where}: escalate_to= is a group's name, and needs a due= (it moves when overdue "
                               f"by as much again), not {escalate_to!r}")


def _check_when(workflow: str, when: Any) -> None:
    if when is not None and not callable(when):
        raise DeclarationError(f"{workflow}: when= must be a function of ctx")


def generation() -> int:
    """How many declarations the registry has seen: what this process's code is, for caches derived from it."""
    return _changes


def _declaring_module(workflow: Workflow) -> str:
    """The module whose code declares `workflow`: the first caller outside its constructors (a subclass's
    __init__ included), by the frames' globals; '<unknown>' for code run without a module name."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (frame.f_globals.get("__name__") == __name__
                                        or frame.f_locals.get("self") is workflow):
        frame = frame.f_back
    return str(frame.f_globals.get("__name__", "<unknown>"))


def _declared() -> None:
    global _changes
    _changes += 1


def effect_key(run_id: str, step: str) -> str:
    """Name the effect of one step of one run: stable across attempts and resumes. The claim's SQL spells the
    same key for a first step (store.claims.CLAIM), which a test holds to this one."""
    return f"{run_id}:{step}"
