"""Drive one claimed run: compute the boundary once, settle what is in doubt by policy, run the remainder.

Every step that acts goes intent commit -> the call -> result commit, and the call is never made inside a
database transaction. The only `except Exception` in durableruns is here, around users' step and lookup
functions, and it never turns an unknown outcome into a failure: only a declared rejection is `failed`.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from durableruns import children, conf, deadlines, faults, plans, releasing, signals, store, turns, waiting, waits
from durableruns.assignments import opening
from durableruns.boundary import Boundary, StepAttempt, compute_boundary
from durableruns.clock import Clock
from durableruns.context import StepContext
from durableruns.errors import DeclarationError, EffectInTransaction, FencedOut, ResultNotJSON, UnknownWorkflow
from durableruns.held import Held
from durableruns.holdings import assess, given_back, release_order
from durableruns.models import Escalation, Resolution, RunState, RunStatus, RunStep
from durableruns.passes import (
    Pass,
    RunOutcome,
    Stop,
    crash_loop,
    describe,
    done_elsewhere,
    ensure_autocommit,
    fails,
    fresh_intent,
    held_for,
    intent_after,
    load_attempts,
    step_timeout,
    stopped_reason,
)
from durableruns.plans import Plan
from durableruns.policies import (
    Action,
    Next,
    Outcome,
    Policy,
    after_failure,
    after_lookup,
    after_lookup_error,
    cap_attempts,
    cap_crashes,
    lookup_errors,
    settle_in_doubt,
)
from durableruns.registry import Step, Workflow, effect_key, get_workflow
from durableruns.store import Claimed, Intent, Lease
from durableruns.tracebacks import error_detail

if TYPE_CHECKING:
    from durableruns.worker.heartbeat import Heartbeat

log = logging.getLogger("durableruns")


def tracing_in_use() -> ModuleType | None:
    """durableruns.tracing once the process uses OpenTelemetry, else None, and nothing of it is imported.

    Only a process that imported OpenTelemetry's API can have a span current or a tracer provider configured; one
    without the [otel] extra never can, and one that has it but does not trace pays nothing, not even the import.
    """
    if "opentelemetry.trace" not in sys.modules:
        return None
    from durableruns import tracing

    return tracing


class Engine:
    """Works claimed runs. `clock` is injectable so tests can move time past a lookup's lag.

    `heartbeat` renews the lease of every run in hand (a worker process shares one among its threads; used alone,
    the engine starts its own). `stopping` is asked between steps: once it says yes, the run is handed back
    (pending) after the step in hand, with no next intent recorded, so it is not left in doubt.

    The one loop over the plan: a step that waits has its move recorded by durableruns.waiting, a release of what
    the run holds by durableruns.releasing. Both ask the engine only for what passes.Driver names (release,
    end_unfinished, look_up, call, asking), the moves every kind shares.
    """

    def __init__(self, clock: Clock | None = None, *, heartbeat: Heartbeat | None = None,
                 stopping: Callable[[], bool] | None = None) -> None:
        self.clock = clock or store.DATABASE
        self._heartbeat = heartbeat
        self._own_heartbeat = False
        self._stopping = stopping or (lambda: False)

    def __enter__(self) -> Engine:
        if self._heartbeat is None:
            from durableruns.worker.heartbeat import Heartbeat  # the engine used alone renews its own leases

            self._heartbeat = Heartbeat(self.clock).start()
            self._own_heartbeat = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own_heartbeat and self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat, self._own_heartbeat = None, False

    # -- entry point -------------------------------------------------------------------------------------

    def work(self, claimed: Claimed) -> RunOutcome:
        """Work one claimed run until it completes, waits, needs a person, fails, or the lease is lost."""
        if self._heartbeat is None:  # used outside `with Engine() as engine:`: a heartbeat for this run only
            with self:
                return self.work(claimed)
        self._heartbeat.hold(claimed.lease)
        try:
            traces = tracing_in_use()
            return self._work(claimed) if traces is None else traces.run_pass(claimed, self._work)
        finally:
            self._heartbeat.drop(claimed.lease)

    def _work(self, claimed: Claimed) -> RunOutcome:
        lease = claimed.lease
        if claimed.overdue and not claimed.ending:  # past its deadline: ended, not worked (durableruns.deadlines)
            return deadlines.end_claimed(claimed, self.clock)
        # The run follows its own plan; this deploy supplies the functions of its steps, by name, where it
        # declares them with the recorded policy. Nothing fails a run because the code changed.
        try:
            workflow: Workflow | None = get_workflow(claimed.workflow)
        except UnknownWorkflow:
            workflow = None
        plan = store.plan_of(claimed.workflow, claimed.plan_fingerprint)
        attempts = load_attempts(lease.run_id) if claimed.attempts is None else claimed.attempts
        # A run going on after it gave back what it held acquires it again (durableruns.holdings.given_back).
        again = given_back(workflow.acquisitions(), attempts) if workflow and not claimed.ending else frozenset()
        # Once, before any step runs.
        boundary = compute_boundary(plan.names if plan else (), attempts, given_back=again,
                                    waits=plan.waits if plan else None)
        if plan is None:
            return self._leave(claimed, None, (), workflow_missing=workflow is None)
        if workflow is not None and workflow.fingerprint == plan.fingerprint:
            missing: tuple[str, ...] = ()  # this deploy's own plan: the hot path
        else:
            missing = plans.lacking(plan, workflow.policies() if workflow else None, boundary.remainder)
        # A run ending unfinished needs only its acquisitions' releases, not the steps it will never run.
        if missing and not (claimed.ending and workflow is not None):
            return self._leave(claimed, plan, missing, workflow_missing=workflow is None,
                               workflow=workflow, attempts=attempts, boundary=boundary)
        if workflow is None:  # every step done already: nothing of this deploy's is needed
            return self.release(lease, RunStatus.COMPLETED, "")
        looping = "" if claimed.ending else crash_loop(claimed, boundary)  # intent=False: nothing else counts
        if looping:
            return self.release(lease, RunStatus.NEEDS_DECISION, looping)
        store.record_plan(plan, clock=self.clock)  # a no-op once this process knows it is recorded
        state = self._pass(claimed, plan, workflow, boundary, attempts)
        if claimed.ending:  # a run ending unfinished gives back what it holds, then ends
            stopped = stopped_reason(claimed, plan, missing) if missing else ""
            return self._settled(state, lambda: self.end_unfinished(state, claimed.ending, "", stopped=stopped))
        return self._settled(state, lambda: self._drive(state))

    def _settled(self, state: Pass, go: Callable[[], RunOutcome]) -> RunOutcome:
        """Run the pass `go`; its outcome, whether it returned, stopped (Stop), or found itself fenced out, with
        the steps this pass ran (those that raised too), however the outcome was made."""
        try:
            outcome = go()
        except Stop as stop:
            outcome = stop.outcome
        except FencedOut as exc:
            lease = state.lease
            log.warning("run %s: fenced out: %s", lease.run_id, exc)
            try:  # it has left the step: a limited run's slot frees now, not when the lease runs out
                store.let_go(lease)
            except DatabaseError as again:
                log.warning("run %s: could not let go (the lease runs out on its own): %s", lease.run_id, again)
            return RunOutcome(run_id=lease.run_id, status="fenced_out",
                              detail=f"another worker took the run (epoch {lease.epoch} is stale); wrote nothing more",
                              steps_run=state.steps_run)
        return replace(outcome, steps_run=state.steps_run) if outcome.steps_run != state.steps_run else outcome

    # -- the pass ----------------------------------------------------------------------------------------

    def _pass(self, claimed: Claimed, plan: Plan, workflow: Workflow, boundary: Boundary,
              attempts: list[StepAttempt]) -> Pass:
        steps = [workflow.get(name) or done_elsewhere(name, policy) for name, policy in plan.steps]
        state = Pass(claimed=claimed, steps=steps, workflow=workflow, boundary=boundary, attempts=attempts)
        state.results = {s: boundary.latest[s].result for s in boundary.done}
        return state

    def _drive(self, state: Pass) -> RunOutcome:
        plan = state.steps
        # Committed together with the previous step's result, or for the first step of a fresh run, the claim.
        pending_intent: Intent | None = state.claimed.first_intent
        intent: Intent | None
        for index, step in enumerate(plan):
            if step.name in state.boundary.done:
                continue
            if pending_intent is None and self._stopping():  # nothing in hand, nothing in doubt: hand it back
                raise Stop(self.release(state.lease, RunStatus.PENDING,
                                        f"handed back before {step.name}: its worker was stopping"))
            latest = state.boundary.latest.get(step.name)
            if pending_intent is not None and pending_intent.step == step.name:
                intent, pending_intent = pending_intent, None
                recorded = True
            else:
                intent, recorded = self._first_move(state, step, index, latest)
                if intent is None:  # settled without running (completed by lookup or decision)
                    continue
            pending_intent = self._run_until_settled(state, step, index, intent, recorded, plan)
        if not state.finished:
            store.release(state.lease, status=RunStatus.COMPLETED, clock=self.clock)
        return RunOutcome(run_id=state.run_id, status=RunStatus.COMPLETED,
                          detail=f"all {len(plan)} steps complete" if len(plan) != 1 else "its 1 step complete",
                          steps_run=state.steps_run)

    def _first_move(self, state: Pass, step: Step, index: int, latest: StepAttempt | None
                    ) -> tuple[Intent | None, bool]:
        """Decide what the boundary says about this step; return the intent to run, or None if settled."""
        if step.when is not None and waits.needs_asking([a for a in state.attempts if a.step == step.name]):
            if not self._applies(state, step, index):
                return None, False  # recorded skipped, once
            if step.wait is None:  # its intent records the answer
                return fresh_intent(state, step, index, attempt=state.next_attempt(step)), False
            latest = None  # the wait begins (or completes at once): that records the answer
        if step.wait is not None:  # a step that waits: its kind says the move (durableruns.waits)
            waiting.wait_move(self, state, step, index, latest)
            return None, False
        if latest is None:
            return fresh_intent(state, step, index, attempt=1), False
        if latest.status == "completed":  # an acquisition the run gave back: acquired again, under a new key
            return fresh_intent(state, step, index, attempt=latest.attempt + 1), False
        if latest.status == "failed":
            verdict = cap_attempts(Next(action=Action.RUN, reason=f"retrying {step.name} after a failure"),
                                   failures=state.tally(step.name)[0], max_attempts=step.max_attempts)
            return self._apply(state, step, index, latest, verdict)
        return self._settle(state, step, index, latest)

    def _settle(self, state: Pass, step: Step, index: int, attempt: StepAttempt, cause: str = ""
                ) -> tuple[Intent | None, bool]:
        """Settle an in-doubt attempt by the step's policy; `cause` says what put it in doubt, if it was seen."""
        signals.send_on_commit(signals.step_in_doubt, RunStep, run_id=state.run_id, workflow=state.claimed.workflow,
                               step=step.name, attempt=attempt.attempt, effect_key=attempt.effect_key,
                               policy=step.policy.value, cause=cause)
        traces = tracing_in_use()
        if traces is None:
            verdict = self._verdict(state, step, attempt, cause)
        else:
            verdict = traces.settle(run_id=state.run_id, workflow=state.claimed.workflow, step=step.name,
                                     attempt=attempt.attempt, policy=step.policy,
                                     decide=lambda: self._verdict(state, step, attempt, cause))
        return self._apply(state, step, index, attempt, verdict)

    def _verdict(self, state: Pass, step: Step, attempt: StepAttempt, cause: str) -> Next:
        """What the step's policy makes of an in-doubt attempt: asks its lookup, or reads staff's decision."""
        outcome, escalation_open = self._escalation_state(state.run_id, step, attempt)
        verdict = settle_in_doubt(step.policy, attempt=attempt, escalation_open=escalation_open,
                                  staff_outcome=outcome)
        if verdict.action is Action.LOOK_UP:
            verdict = self.look_up(state, step, attempt)
        if cause:
            verdict = replace(verdict, reason=f"{verdict.reason} (the call raised {cause})")
        if step.policy is not Policy.ESCALATE:  # a person settles each escalation: no budget to count there
            verdict = cap_crashes(verdict, step=step.name, crashes=state.tally(step.name)[1],
                                  max_crashes=conf.max_crashes())
        return verdict

    def _apply(self, state: Pass, step: Step, index: int, attempt: StepAttempt, verdict: Next
               ) -> tuple[Intent | None, bool]:
        lease = state.lease
        action = verdict.action
        if action is Action.RUN:
            restored = attempt if attempt.loop_cursor or attempt.progress else None
            return fresh_intent(state, step, index, attempt=attempt.attempt + 1, restored=restored), False
        if action is Action.COMPLETE:
            resolution = Resolution.LOOKUP if step.policy is Policy.RESOLVABLE else Resolution.DECISION
            encoded = store.to_json(verdict.result, what=f"the result of {step.name}")
            store.record_result(lease, step=step.name, attempt=attempt.attempt, result=verdict.result,
                                cursor=index + 1, clock=self.clock, resolution=resolution, encoded=encoded)
            state.results[step.name] = json.loads(encoded)  # as recorded, exactly as a resume will read it
            return None, False
        if action is Action.WAIT:
            raise Stop(self.release(lease, RunStatus.WAITING, verdict.reason, wake_at=verdict.until))
        if action is Action.ESCALATE:
            store.open_escalation(lease, step=step.name, attempt=attempt.attempt, effect_key=attempt.effect_key,
                                  in_doubt_since=attempt.started_at or attempt.raised_at, reason=verdict.reason,
                                  inbox=opening(step, lambda: state.context(step, attempt.attempt)), clock=self.clock)
            raise Stop(RunOutcome(run_id=state.run_id, status=RunStatus.NEEDS_DECISION,
                                  detail=verdict.reason, steps_run=state.steps_run))
        if action in (Action.HOLD, Action.STOP):
            raise Stop(self.release(lease, RunStatus.NEEDS_DECISION, verdict.reason))
        if action is Action.CANCEL:
            raise Stop(self.end_unfinished(state, RunStatus.CANCELLED, verdict.reason))
        raise Stop(self.end_unfinished(state, RunStatus.FAILED, f"{step.name}: {verdict.reason}"))

    # -- when= and steps that wait (durableruns.waits) ---------------------------------------------------------

    def asking(self, state: Pass, step: Step, index: int, ask: Callable[[], Any],
               raised: str = waits.ASKING_RAISED) -> Any:
        """Ask users' code a question about `step` before it acts (its when=, a sleep's time). A raise is the
        step's error under its policy: an observed failure of an attempt that did nothing, retried with backoff
        up to its attempts, then the run fails."""
        try:
            ensure_autocommit()
            return ask()
        except (FencedOut, EffectInTransaction):
            raise
        except Exception as exc:  # users' code
            error = f"{raised}{describe(exc)}"  # which question raised: a when= is asked again, a time not
        attempt = state.next_attempt(step)
        store.record_failure(state.lease, step=step.name, attempt=attempt, error=error, clock=self.clock,
                             intent_recorded=False, effect_key=effect_key(state.key_base, step.name))
        counts = state.tally(step.name)  # from the record as it was read, then counted in the pass
        state.attempts.append(StepAttempt(step=step.name, attempt=attempt, status="failed", error=error))
        counts[0] += 1
        verdict = after_failure(attempts_made=state.tally(step.name)[0], max_attempts=step.max_attempts,
                                now=self.clock.now(), backoff=conf.retry_backoff(),
                                backoff_max=conf.retry_backoff_max())
        if verdict.action is Action.FAIL:
            raise Stop(self.end_unfinished(state, RunStatus.FAILED, f"{step.name}: {error}; {verdict.reason}"))
        raise Stop(self.release(state.lease, RunStatus.WAITING if verdict.until else RunStatus.PENDING,
                                f"{step.name}: {error}; {verdict.reason}", wake_at=verdict.until))

    def _applies(self, state: Pass, step: Step, index: int) -> bool:
        """Ask the step's when= once; a False is recorded (a skipped attempt, result None) and never asked again."""
        when = step.when
        assert when is not None
        applies = bool(self.asking(state, step, index, lambda: when(state.context(step, 1))))
        if not applies:
            attempt = state.next_attempt(step)
            store.record_result(state.lease, step=step.name, attempt=attempt, result=None, cursor=index + 1,
                                clock=self.clock, resolution=Resolution.SKIPPED, intent_recorded=False,
                                effect_key=effect_key(state.key_base, step.name))
            state.attempts.append(StepAttempt(step=step.name, attempt=attempt, status="completed"))
            state.results[step.name] = None
        return applies

    def _run_until_settled(self, state: Pass, step: Step, index: int, intent: Intent, recorded: bool,
                           plan: list[Step]) -> Intent | None:
        """Run attempts of `step` until it completes; return the next step's intent if it shared the commit, or
        if this step's result is held for the next step's commit (durableruns.held: neither records an intent)."""
        while True:
            lease = state.lease
            # A step with when= records its intent whatever it declares: the intent records the answer, once.
            intends = step.intent or step.when is not None
            if step.rate is not None and not recorded:  # each attempt that starts takes a turn (durableruns.turns)
                turns.take_turn(self, state, step, index, intent.attempt)
            if intends and not recorded:
                faults.reached("before_intent", step.name)
                store.record_intent(lease, intent, clock=self.clock)  # commit 1: before the step acts
            recorded = intends
            faults.reached("after_intent", step.name)
            began = time.monotonic()
            try:
                result, encoded = self.call(state, step, intent, recorded=recorded)
            except (FencedOut, EffectInTransaction):
                raise
            except Exception as exc:  # users' code: classify, never retry blindly
                state.steps_run += 1  # it ran, and raised: counted as run (the pass's summary, the metric)
                self._commit_held(state, index)  # before anything the raise records
                follow = self._after_error(state, step, index, intent, recorded, exc)
                if follow is None:
                    return None
                intent, recorded = follow
                continue
            faults.reached("after_return", step.name)
            # Only an attempt that recorded nothing may wait for a later commit: one with an intent is due now.
            following = None if recorded else held_for(state, plan, index, began, stopping=self._stopping())
            if following is not None:  # no commit: the next step records no intent either (durableruns.held)
                state.held.append(Held(step=step.name, attempt=intent.attempt, effect_key=intent.effect_key,
                                       encoded=encoded))
                state.results[step.name] = json.loads(encoded)
                state.steps_run += 1
                faults.reached("result_held", step.name)
                return following
            # A stopping worker records no next intent: the run is handed back between steps, not left in doubt.
            next_intent = None if self._stopping() else intent_after(state, plan, index)
            if next_intent is not None:  # its intent rides on this commit, so "before" it is now
                faults.reached("before_intent", next_intent.step)
            last = index + 1 == len(plan)
            store.record_result(lease, step=step.name, attempt=intent.attempt, result=result, cursor=index + 1,
                                clock=self.clock, intent_recorded=recorded, effect_key=intent.effect_key,
                                next_intent=next_intent, finish=last, encoded=encoded,
                                attributes=state.attributes,  # what ctx.set_attributes gave, in this commit
                                children=list(state.children.values()),  # commit 2, the last thing the step does
                                held=state.held)
            state.children, state.held = {}, []
            state.finished = last
            # Later steps see the result as recorded (JSON's keys are strings, its arrays lists), exactly as they
            # would after a resume: a pass that ran live and one that resumed must not see different values.
            state.results[step.name] = json.loads(encoded)
            state.steps_run += 1
            return next_intent

    def _commit_held(self, state: Pass, index: int) -> None:
        """Commit the results held for a commit that will not come (the step in hand raised), cursor at it."""
        if state.held:
            store.record_held(state.lease, state.held, cursor=index, clock=self.clock)
            state.held = []

    def call(self, state: Pass, step: Step, intent: Intent, *, recorded: bool = True) -> tuple[Any, str]:
        """Run the step; return its result and the result's JSON (encoded once, refused here if it is not). An
        attempt with no intent `recorded` has no started row to checkpoint or report progress into: asked to, it
        raises DeclarationError (the attempt fails, as any error of a re_executable step)."""
        lease = state.lease

        def unrecorded(*_: Any) -> None:
            raise DeclarationError(f"{step.name} is declared intent=False: it records no attempt before it acts, so "
                                   f"it cannot checkpoint (ctx.loop, ctx.map) or report progress; declare it with its "
                                   f"intent", step=step.name)

        # The step gets its own copy of the last committed progress: what it changes before it raises must not
        # leak into the copy a new attempt starts from (nested lists would, with a shallow copy).
        state.loop_cursor, state.progress = intent.loop_cursor, copy.deepcopy(dict(intent.progress or {}))

        def checkpoint(loop_cursor: int, progress: dict[str, Any]) -> None:
            if not recorded:
                unrecorded()
            store.checkpoint(lease, step=step.name, attempt=intent.attempt, loop_cursor=loop_cursor,
                             progress=progress, clock=self.clock)
            state.loop_cursor, state.progress = loop_cursor, copy.deepcopy(progress)  # as committed

        state.children, state.attributes = {}, {}  # what this attempt asks for; a raise drops it

        def start_child(workflow: Workflow | str, input: Any, key: Any) -> str:
            if step.policy is Policy.RE_EXECUTABLE:  # recorded with the step's result (durableruns.children)
                return children.ask(state.run_id, step.name, workflow, input, key=key, asked=state.children)
            return children.start(lease, step.name, workflow, input, key=key, clock=self.clock)

        ctx = StepContext(
            run_id=state.run_id, step=step.name, input=state.claimed.input, results=state.results,
            effect_key=intent.effect_key, attempt=intent.attempt,
            timeout=step_timeout(step),
            progress=copy.deepcopy(state.progress), loop_start=intent.loop_cursor, checkpoint=checkpoint,
            start_child=start_child, attributes=state.attributes,
            report=store.reporter(lease, step.name, intent.attempt, self.clock) if recorded else unrecorded,
        )
        ensure_autocommit()
        with traced_call(state, step, intent.attempt):
            try:
                result = step.fn(ctx)
                ctx.report_held()  # a progress report held by the one-a-second limit is committed before the result
            except (FencedOut, EffectInTransaction):
                raise
            except Exception:
                ctx.flush()  # what its maps finished is kept: a new attempt calls their functions only for the rest
                raise
            return result, store.to_json(result, what=f"the result of {step.name}")

    def _after_error(self, state: Pass, step: Step, index: int, intent: Intent, recorded: bool,
                     exc: Exception) -> tuple[Intent, bool] | None:
        """Classify a step's exception: a rejection (or a re-executable step) failed; anything else is in doubt."""
        error = describe(exc)
        bug = not step.is_rejection(exc)  # a declared rejection: a business outcome, no traceback
        log.log(logging.ERROR if bug else logging.INFO, "run %s: %s attempt %s raised %s", state.run_id, step.name,
                intent.attempt, error, exc_info=exc if bug else None)
        if fails(step, exc):
            now = self.clock.now()
            store.record_failure(state.lease, step=step.name, attempt=intent.attempt, error=error, clock=self.clock,
                                 intent_recorded=recorded, effect_key=intent.effect_key, detail=error_detail(exc))
            state.tally(step.name)[0] += 1
            verdict = after_failure(attempts_made=state.tally(step.name)[0],
                                    max_attempts=step.max_attempts, now=now, backoff=conf.retry_backoff(),
                                    backoff_max=conf.retry_backoff_max())
            if verdict.action is Action.RUN:
                restored = StepAttempt(step=step.name, attempt=intent.attempt, status="failed",
                                       loop_cursor=state.loop_cursor, progress=state.progress)
                return fresh_intent(state, step, index, attempt=intent.attempt + 1,
                                          restored=restored if state.loop_cursor or state.progress else None), False
            if verdict.action is not Action.WAIT:
                raise Stop(self.end_unfinished(state, RunStatus.FAILED, f"{step.name}: {error}; {verdict.reason}"))
            raise Stop(self.release(state.lease, RunStatus.WAITING, f"{step.name}: {error}; {verdict.reason}",
                                    wake_at=verdict.until))
        # The call may have reached the far system: the attempt stays started (in doubt) and goes through
        # its policy, exactly as if the process had died here (and counts against the crash budget as such).
        # Its call was over when it raised: that moment, recorded, bounds it for this pass and every later one.
        raised_at = (store.record_raised(state.lease, step=step.name, attempt=intent.attempt, clock=self.clock,
                                         detail=error_detail(exc)) if recorded else self.clock.now())
        # What the attempt committed, as the record has it: a new attempt continues from its last checkpoint.
        attempt = StepAttempt(step=step.name, attempt=intent.attempt, status="started",
                              effect_key=intent.effect_key, raised_at=raised_at,
                              loop_cursor=state.loop_cursor, progress=state.progress)
        state.tally(step.name)[1] += 1
        moved, _ = self._settle(state, step, index, attempt, cause=error.splitlines()[-1])
        if moved is None:
            return None
        return moved, False

    # -- ending unfinished (issue 15: durableruns/releasing.py records the releases) ----------------------

    def end_unfinished(self, state: Pass, ending: str, reason: str, *, stopped: str = "") -> RunOutcome:
        """End the run as `ending` (cancelled or failed; needs_decision for a run stopped for a missing step),
        first giving back every acquisition it holds. `stopped`: the reason a stopped run ends with, as its
        deploy now finds it (a release escalated meanwhile has its own)."""
        return releasing.end_unfinished(self, state, ending=ending, reason=reason, stopped=stopped)

    # -- helpers -----------------------------------------------------------------------------------------

    def look_up(self, state: Pass, step: Step, attempt: StepAttempt) -> Next:
        """Ask the step's lookup what became of the in-doubt `attempt`: its verdict (found, absent, too early)."""
        if step.lookup is None:  # Workflow.step() refuses a resolvable step without one
            raise DeclarationError(f"{step.name} is looked up but declares no lookup=")
        ctx = StepContext(run_id=state.run_id, step=step.name, input=state.claimed.input, results=state.results,
                          effect_key=attempt.effect_key, attempt=attempt.attempt,
                          timeout=step_timeout(step))
        try:
            ensure_autocommit()
            found = step.lookup(ctx)
            if found is not None and not isinstance(found, dict):
                # Neither an effect nor a "not found": an empty list must not complete the step, nor "yes"
                raise ResultNotJSON(f"the lookup of {step.name} returned a {type(found).__name__}, "
                                    f"not a dict (found) or None (not found)")
            if found is not None:
                store.ensure_json(found, what=f"the lookup result of {step.name}")
        except (EffectInTransaction, ResultNotJSON) as exc:
            return self._lookup_failed(state, attempt, str(exc))
        except Exception as exc:  # a lookup that raises proves nothing; never taken as absence
            return self._lookup_failed(state, attempt, describe(exc))
        return after_lookup(found, attempt=attempt, now=self.clock.now(), timeout=step_timeout(step),
                            lookup_lag=step.lookup_lag, lease=timedelta(seconds=conf.lease_seconds()))

    def _lookup_failed(self, state: Pass, attempt: StepAttempt, error: str) -> Next:
        """Ask again later, counting this error on from the run's reason (what the last wait recorded); past
        DURABLERUNS_MAX_LOOKUP_ERRORS in a row, stop for staff."""
        reason = RunState.objects.filter(pk=state.run_id).values_list("reason", flat=True).first() or ""
        return after_lookup_error(error, now=self.clock.now(), retry_in=conf.lookup_retry(), attempt=attempt,
                                  errors=lookup_errors(reason, attempt=attempt) + 1,
                                  max_errors=conf.max_lookup_errors())

    def _escalation_state(self, run_id: str, step: Step, attempt: StepAttempt) -> tuple[Outcome | None, bool]:
        if step.policy is not Policy.ESCALATE:
            return None, False
        escalation = (Escalation.objects.for_attempt(run_id, step.name, attempt.attempt)
                      .select_related("decision").first())
        if escalation is None:
            return None, False
        decision = getattr(escalation, "decision", None)
        if decision is None:
            return None, True
        return Outcome(decision.action), False

    def _leave(self, claimed: Claimed, plan: Plan | None, missing: tuple[str, ...], *, workflow_missing: bool,
               workflow: Workflow | None = None, attempts: list[StepAttempt] | None = None,
               boundary: Boundary | None = None) -> RunOutcome:
        """This deploy lacks steps the run still needs (or its whole plan): leave the run, with no attempt and
        nothing counted, for a worker whose deploy has them, and once the grace period has passed since a worker
        first found it so (the database's clock), stop it for staff, first giving back what it holds (where this
        deploy declares the releases). If a deploy with the steps comes back, the run goes on and acquires again
        what it gave back (durableruns.holdings.given_back)."""
        lease = claimed.lease
        now = self.clock.now()
        reason = RunState.objects.filter(pk=lease.run_id).values_list("reason", flat=True).first() or ""
        since = plans.lacking_since(reason) or now
        grace = conf.missing_step_grace()
        wake_at = plans.after_lacking(since=since, now=now, grace=grace, retry=conf.missing_step_retry())
        named = claimed.workflow if workflow_missing else None
        if wake_at is not None:
            return self.release(lease, RunStatus.WAITING, plans.waiting_reason(
                fingerprint=claimed.plan_fingerprint, plan=plan, missing=missing, since=since, workflow=named),
                wake_at=wake_at)
        stopped = stopped_reason(claimed, plan, missing, workflow=named)
        if (workflow is not None and plan is not None and boundary is not None and attempts is not None
                and release_order(assess(plan.names, workflow.acquisitions(), attempts))):
            state = self._pass(claimed, plan, workflow, boundary, attempts)
            return self._settled(state, lambda: self.end_unfinished(state, RunStatus.NEEDS_DECISION, stopped,
                                                                    stopped=stopped))
        return self.release(lease, RunStatus.NEEDS_DECISION, stopped)

    def release(self, lease: Lease, status: str, reason: str, wake_at: datetime | None = None) -> RunOutcome:
        """Hand the run back as `status` (waiting until `wake_at`, pending, or stopped) and say so."""
        store.release(lease, status=status, clock=self.clock, wake_at=wake_at, reason=reason)
        detail = f"{reason} (until {wake_at:%H:%M:%S})" if wake_at else reason
        return RunOutcome(run_id=lease.run_id, status=status, detail=detail, wake_at=wake_at)


def traced_call(state: Pass, step: Step, attempt: int) -> AbstractContextManager[None]:
    """The attempt's span around its call (durableruns.tracing), or nothing without the [otel] extra."""
    traces = tracing_in_use()
    if traces is None:
        return nullcontext()
    return traces.call(
        run_id=state.run_id,
        workflow=state.claimed.workflow,
        step=step.name,
        attempt=attempt,
        policy=step.policy,
        fails=lambda exc: fails(step, exc),
    )
