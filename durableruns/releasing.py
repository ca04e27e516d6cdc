"""Give back what a run holds before it ends unfinished: the release steps, a kind of move the engine makes.

A run cancelled, abandoned or failed first releases every completed, unreleased acquisition, in reverse order
of completion (durableruns.holdings decides what and in what order, from the record), then reaches its final
status. Each release is recorded in run_step like any step, under "<step>:release" with its own effect key:
intent before, result after, attempts appended; so a crash in the middle resumes the releasing from the record.
A release that fails observably is retried with backoff and, its attempts used up, escalated to staff: the run
never pretends a hold is gone. An acquisition in doubt is looked up first where it has a lookup; without one it
is left "possibly held" for staff, never released blindly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from durableruns import conf, faults, store
from durableruns.boundary import StepAttempt
from durableruns.errors import DeclarationError, EffectInTransaction, FencedOut
from durableruns.holdings import (
    HoldState,
    assess,
    last_completed,
    latest_attempts,
    release_order,
    release_round,
    round_key,
)
from durableruns.models import Escalation, Resolution, RunStatus
from durableruns.passes import Driver, Pass, RunOutcome, Stop, describe, load_attempts
from durableruns.policies import Action, Next, Outcome, Policy, after_failure, cap_crashes
from durableruns.registry import Step, effect_key
from durableruns.store import Intent


def end_unfinished(engine: Driver, state: Pass, *, ending: str, reason: str, stopped: str = "") -> RunOutcome:
    """Release what the run holds, then give it the status `ending`; a wait or an escalation stops the pass
    (the run keeps `ending`, so the next claim goes on releasing).

    `ending` needs_decision is a run stopped for a step its deploy lacks: it ends stopped, with `stopped` as its
    reason (what it lacks, what staff can do), so a deploy that has the step reopens it; if the deploy that
    finished the releasing has the steps again (`stopped` empty), the run goes on at once instead, and acquires
    again what it gave back."""
    workflow = state.workflow
    acquisitions = workflow.acquisitions()
    attempts = load_attempts(state.run_id) if acquisitions else []
    todo = release_order(assess(state.plan_names, acquisitions, attempts))
    if not todo and not state.claimed.ending:  # nothing held: end at once, as a run without acquisitions does
        return engine.release(state.lease, ending, reason)
    if not state.claimed.ending:
        store.begin_ending(state.lease, ending=ending, reason=reason, clock=engine.clock)
    latest = latest_attempts(attempts)
    state.results = {s: a.result for s, a in latest.items() if a.status == "completed" and s in state.plan_names}
    given_back = []
    for holding in todo:
        step = workflow[holding.step]
        if holding.state is HoldState.POSSIBLY_HELD:
            if not _settle_acquisition(engine, state, step, latest[holding.step]):
                continue  # provably never acquired: nothing to give back
            attempts = [*attempts, replace(latest[holding.step], status="completed")]  # found: as now recorded
        if step.releaser is None:  # every acquisition declares one (Workflow.acquisitions)
            raise DeclarationError(f"{step.name} is held by run {state.run_id} but declares no release=")
        if _release_one(engine, state, step, step.releaser, attempts):
            given_back.append(holding.step)
    final: dict[str, str] = {}
    if ending == RunStatus.NEEDS_DECISION:
        final = (
            {"reason": stopped}
            if stopped
            else {
                "status": RunStatus.PENDING,
                "reason": "this deploy has the steps of the run's plan again: it goes on, acquiring again what it "
                "gave back",
            }
        )
    status = store.end(state.lease, clock=engine.clock, **final)
    detail = f"gave back {', '.join(given_back)} before ending" if given_back else "nothing held to give back"
    raise Stop(RunOutcome(run_id=state.run_id, status=status, detail=detail, steps_run=state.steps_run))


def _settle_acquisition(engine: Driver, state: Pass, step: Step, attempt: StepAttempt) -> bool:
    """Look an in-doubt acquisition up by its key: found is held (record it, return True); absent past the lag
    is nothing held (the attempt is recorded failed: it provably never took effect); too early waits."""
    verdict = engine.look_up(state, step, attempt)
    if verdict.action is Action.COMPLETE:
        encoded = store.to_json(verdict.result, what=f"the result of {step.name}")
        index = state.plan_names.index(step.name)
        store.record_result(
            state.lease,
            step=step.name,
            attempt=attempt.attempt,
            result=verdict.result,
            cursor=index + 1,
            clock=engine.clock,
            resolution=Resolution.LOOKUP,
            encoded=encoded,
        )
        state.results[step.name] = json.loads(encoded)
        return True
    if verdict.action is Action.RUN:
        store.record_failure(
            state.lease,
            step=step.name,
            attempt=attempt.attempt,
            clock=engine.clock,
            error=f"not found by key {attempt.effect_key} once absence was provable: the run "
            f"ended unfinished, so it was not run again and nothing is held",
        )
        return False
    if verdict.action is Action.STOP:  # its lookup raised too many times in a row: staff check the far system
        raise Stop(engine.release(state.lease, RunStatus.NEEDS_DECISION, verdict.reason))
    raise Stop(engine.release(state.lease, RunStatus.WAITING, verdict.reason, wake_at=verdict.until))


def _release_one(
    engine: Driver, state: Pass, acquisition: Step, release: Step, attempts: Sequence[StepAttempt]
) -> bool:
    """Bring the release of one held acquisition to completed, from wherever its record stands; False if staff
    abandoned it (the hold stays listed, the run goes on with its other releases)."""
    key = round_key(effect_key(state.key_base, release.name), release_round(acquisition.acquisition(), attempts))
    mine = sorted((a for a in attempts if a.step == release.name), key=lambda a: a.attempt)
    last = mine[-1] if mine else None
    # Failures count again after staff said an escalated release did not happen, and for each new holding: the
    # releases of one the run gave back before (and then acquired again) are not this release's attempts.
    floor = last_completed(attempts, release.name)
    if last is not None and last.status == "failed":
        escalation = (
            Escalation.objects.for_attempt(state.run_id, release.name, last.attempt).select_related("decision").first()
        )
        if escalation is not None:
            decision = getattr(escalation, "decision", None)
            if decision is None:
                raise Stop(
                    engine.release(state.lease, RunStatus.NEEDS_DECISION, f"{release.name} awaits a staff decision")
                )
            if decision.action == Outcome.HAPPENED:
                _record(
                    engine,
                    state,
                    acquisition,
                    release,
                    last.attempt + 1,
                    decision.result or {},
                    resolution=Resolution.DECISION,
                    intent_recorded=False,
                    key=key,
                )
                return True
            if decision.action == Outcome.ABANDON:
                return False  # staff gave up on this release: the hold stays listed as held
            floor = last.attempt
    failures = sum(a.status == "failed" for a in mine if a.attempt > floor)
    crashes = sum(a.status == "started" for a in mine if a.attempt > floor)
    number = last.attempt + 1 if last is not None else 1
    if last is not None and last.status == "started":
        verdict = _in_doubt(engine, state, acquisition, release, last, crashes)
        if verdict is None:
            return True
        number = last.attempt + 1
    elif last is not None and last.status == "failed" and failures >= release.max_attempts:
        _escalate(engine, state, release, key, last.attempt, failures, last.finished_at)  # its backoff was served
    while True:
        intent = Intent(
            step=release.name,
            attempt=number,
            effect_key=key,
            cursor=state.plan_names.index(acquisition.name) + 1,
        )
        faults.reached("before_intent", release.name)
        store.record_intent(state.lease, intent, clock=engine.clock)
        faults.reached("after_intent", release.name)
        try:
            result, encoded = engine.call(state, release, intent)
        except (FencedOut, EffectInTransaction):
            raise
        except Exception as exc:  # users' code: classify, never retry blindly
            error = describe(exc)
            if release.is_rejection(exc) or release.policy is Policy.RE_EXECUTABLE:
                store.record_failure(state.lease, step=release.name, attempt=number, error=error, clock=engine.clock)
                failures += 1
                _after_failed(engine, state, release, key, number, failures, None, error=error)
            else:
                crashes += 1
                in_doubt = StepAttempt(
                    step=release.name,
                    attempt=number,
                    status="started",
                    effect_key=intent.effect_key,
                    raised_at=store.record_raised(state.lease, step=release.name, attempt=number, clock=engine.clock),
                )
                if _in_doubt(engine, state, acquisition, release, in_doubt, crashes) is None:
                    return True
            number += 1
            continue
        faults.reached("after_return", release.name)
        _record(engine, state, acquisition, release, number, result, encoded=encoded, key=key)
        return True


def _in_doubt(
    engine: Driver, state: Pass, acquisition: Step, release: Step, attempt: StepAttempt, crashes: int
) -> Next | None:
    """Settle an in-doubt release: look it up if it can be (found: recorded, None returned), else run it again
    under its key (harmless to repeat), within the crash budget."""
    verdict = Next(action=Action.RUN, reason=f"{release.name} is re-executable: releasing again")
    if release.policy is Policy.RESOLVABLE:
        verdict = engine.look_up(state, release, attempt)
        if verdict.action is Action.COMPLETE:
            _record(
                engine,
                state,
                acquisition,
                release,
                attempt.attempt,
                verdict.result,
                resolution=Resolution.LOOKUP,
                key=attempt.effect_key,
            )
            return None
        if verdict.action is Action.WAIT:
            raise Stop(engine.release(state.lease, RunStatus.WAITING, verdict.reason, wake_at=verdict.until))
    verdict = cap_crashes(verdict, step=release.name, crashes=crashes, max_crashes=conf.max_crashes())
    if verdict.action is Action.STOP:
        raise Stop(engine.release(state.lease, RunStatus.NEEDS_DECISION, verdict.reason))
    return verdict


def _after_failed(
    engine: Driver, state: Pass, release: Step, key: str, attempt: int, failures: int, failed_at: Any, error: str = ""
) -> None:
    """After an observed failure of a release: again now, later (backoff), or, attempts used up, to staff."""
    verdict = after_failure(
        attempts_made=failures,
        max_attempts=release.max_attempts,
        now=engine.clock.now(),
        backoff=conf.retry_backoff(),
        backoff_max=conf.retry_backoff_max(),
    )
    if verdict.action is Action.RUN:
        return
    if verdict.action is Action.WAIT:
        raise Stop(
            engine.release(state.lease, RunStatus.WAITING, f"{release.name}: {verdict.reason}", wake_at=verdict.until)
        )
    _escalate(engine, state, release, key, attempt, failures, failed_at, error)


def _escalate(
    engine: Driver, state: Pass, release: Step, key: str, attempt: int, failures: int, failed_at: Any, error: str = ""
) -> None:
    """Stop for staff: the release failed every attempt it has, and the hold may still exist."""
    reason = (
        f"{release.name} failed {failures} of {release.max_attempts} attempts{': ' + error if error else ''}. "
        f"The hold may still exist at the far system: give it back by hand, then decide 'happened'; "
        f"'did not happen' releases again; 'abandon' ends the run with the hold left listed"
    )
    store.open_escalation(
        state.lease,
        step=release.name,
        attempt=attempt,
        effect_key=key,
        in_doubt_since=failed_at,
        reason=reason,
        clock=engine.clock,
    )
    raise Stop(
        RunOutcome(run_id=state.run_id, status=RunStatus.NEEDS_DECISION, detail=reason, steps_run=state.steps_run)
    )


def _record(
    engine: Driver,
    state: Pass,
    acquisition: Step,
    release: Step,
    attempt: int,
    result: Any,
    *,
    encoded: str | None = None,
    resolution: str = Resolution.RETURNED,
    intent_recorded: bool = True,
    key: str,
) -> None:
    store.record_result(
        state.lease,
        step=release.name,
        attempt=attempt,
        result=result,
        cursor=state.plan_names.index(acquisition.name) + 1,
        clock=engine.clock,
        resolution=resolution,
        encoded=encoded,
        intent_recorded=intent_recorded,
        effect_key=key,
    )
    state.steps_run += 1
