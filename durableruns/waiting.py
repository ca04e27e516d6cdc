"""The steps that wait (a sleep, a wait for an event, an approval, a join): each pass gathers what the record
says about the wait, asks durableruns.waits for its one move, and records that move. Like releasing, a kind of move
the engine makes, not a second driver: the engine's loop hands a waiting step here and goes on (or stops) after.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta

from durableruns import assignments, children, faults, store, waits
from durableruns.boundary import StepAttempt
from durableruns.context import StepContext
from durableruns.errors import DeclarationError
from durableruns.models import Escalation, Intervention, RunStatus
from durableruns.passes import Driver, Pass, RunOutcome, Stop
from durableruns.registry import Step, effect_key


def wait_move(driver: Driver, state: Pass, step: Step, index: int, latest: StepAttempt | None) -> None:
    """Ask durableruns.waits what the record says about the wait `step` now, and record that one move:
    wait (handing the run back, holding nothing), complete (consuming the event, if any, in the same
    commit), or stop the run (fail, escalate, hold for staff, cancel)."""
    wait = step.wait
    assert wait is not None
    lease = state.lease
    begun = latest if latest is not None and latest.status == "started" else None
    event = None
    if wait.kind is waits.Kind.WAIT_FOR:  # its now and its event in one round trip: picked up in milliseconds
        now, event = store.now_and_oldest_event(state.run_id, wait.event, driver.clock)
    else:
        now = driver.clock.now()
    asked = None
    if begun is None and wait.kind is waits.Kind.SLEEP:
        asked = driver.asking(
            state, step, index, lambda: sleep_time(step, state.context(step, 1)), raised=waits.TIME_RAISED
        )
    decision, staff, escalation_open = None, "", False
    if begun is not None and wait.kind is waits.Kind.APPROVAL:
        decision = approval(state.run_id, step.name, begun.attempt)
    if begun is not None and wait.kind is waits.Kind.WAIT_FOR and wait.on_timeout is waits.OnTimeout.ESCALATE:
        escalation = (
            Escalation.objects.for_attempt(state.run_id, step.name, begun.attempt).select_related("decision").first()
        )
        if escalation is not None:
            verdict = getattr(escalation, "decision", None)
            staff, escalation_open = (verdict.action, False) if verdict else ("", True)
    kids: tuple[waits.Child, ...] = ()
    if wait.kind is waits.Kind.JOIN:  # the children's results are read only when the join settles
        kids = children.children_of(state.run_id)
        if waits.join_settles(wait, begun, kids, now):
            kids = children.with_results(kids)
    move = waits.next_move(
        wait,
        step.name,
        waits.Facts(
            now=now,
            attempt=begun,
            asked=asked,
            staff=staff,
            escalation_open=escalation_open,
            decision=decision,
            event=waits.Event(id=event[0], payload=event[1]) if event else None,
            children=kids,
        ),
    )
    attempt = state.next_attempt(step) if move.fresh or begun is None else begun.attempt
    key = effect_key(state.key_base, step.name)
    kind = waits.Move
    if move.move in (kind.BEGIN, kind.WAIT):
        begins = move.move is kind.BEGIN
        store.wait(
            lease,
            step=step.name,
            attempt=attempt,
            until=move.until,
            reason=move.reason,
            event=wait.event,
            approval=wait.kind is waits.Kind.APPROVAL,
            join=wait.kind is waits.Kind.JOIN,
            cursor=index,
            effect_key=key,
            detail=dict(move.detail or {}) if begins else None,
            inbox=assignments.opening(step, lambda: state.context(step, attempt))
            if begins and wait.kind is waits.Kind.APPROVAL
            else None,
            clock=driver.clock,
        )
        raise Stop(
            RunOutcome(run_id=state.run_id, status=RunStatus.WAITING, detail=move.reason, steps_run=state.steps_run)
        )
    if move.move is kind.COMPLETE:
        faults.reached("before_complete", step.name)
        store.complete_wait(
            lease,
            step=step.name,
            attempt=attempt,
            begun=not move.fresh,
            effect_key=key,
            result=move.result,
            resolution=move.resolution,
            cursor=index + 1,
            event_id=move.event_id,
            clock=driver.clock,
        )
        faults.reached("after_complete", step.name)
        state.results[step.name] = copy.deepcopy(move.result)
        state.steps_run += 1
        return
    if move.move is kind.ESCALATE:
        assert begun is not None
        store.open_escalation(
            lease,
            step=step.name,
            attempt=begun.attempt,
            effect_key=key,
            in_doubt_since=begun.started_at,
            reason=move.reason,
            clock=driver.clock,
        )
        raise Stop(
            RunOutcome(
                run_id=state.run_id, status=RunStatus.NEEDS_DECISION, detail=move.reason, steps_run=state.steps_run
            )
        )
    if move.move is kind.HOLD:
        raise Stop(driver.release(lease, RunStatus.NEEDS_DECISION, move.reason))
    ending = RunStatus.CANCELLED if move.move is kind.CANCEL else RunStatus.FAILED
    raise Stop(driver.end_unfinished(state, ending, move.reason))


def sleep_time(step: Step, ctx: StepContext) -> datetime | timedelta:
    """A sleep's `until` or duration, as its declaration (or its function of ctx) says: checked here, so a bad
    answer is the step's error."""
    if step.sleep_until is not None:
        until = step.sleep_until(ctx)
        if not isinstance(until, datetime) or until.tzinfo is None:
            raise DeclarationError(f"{step.name}: until= must return an aware datetime, not {until!r}")
        return until
    duration = step.sleep_for(ctx) if callable(step.sleep_for) else step.sleep_for
    if not isinstance(duration, timedelta):
        raise DeclarationError(f"{step.name}: the duration must be a timedelta, not {duration!r}")
    return duration


def approval(run_id: str, step: str, attempt: int) -> waits.Decision | None:
    """The staff decision on the approval's attempt, if one is recorded."""
    row = (
        Intervention.objects.filter(run_id=run_id, step=step, attempt=attempt, action__in=store.APPROVAL_ACTIONS)
        .values_list("action", "decided_by", "note", "decided_at")
        .first()
    )
    if row is None:
        return None
    action, by, note, at = row
    return waits.Decision(approved=action == Intervention.Action.APPROVE, by=by, note=note, at=at)
