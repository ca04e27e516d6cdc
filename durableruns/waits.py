"""Steps that wait: a sleep, a wait for an event sent to the run, an approval by staff, a join of the child runs
the run started. Pure: no Django, no I/O.

A wait is an attempt row like any step's. Its beginning records, once and on the database's clock, what it waits
for and until when (the attempt's `progress`: {"until": ..., "event": ...}); while it waits the run is `waiting`
with that time as its wake_at, and holds no worker, thread or lease. Each time a worker reaches the step it asks
`next_move` what the record says now (an event kept for the run, a staff decision, the time) and records the one
move it gets back; a resume reads the recorded time back and never computes it again.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from durableruns.boundary import StepAttempt


class Kind(enum.StrEnum):
    """What a wait step waits for; its value stands in the plan where a call step's policy does."""

    SLEEP = "sleep"
    WAIT_FOR = "wait_for"
    APPROVAL = "approval"
    JOIN = "join"


KINDS = frozenset(k.value for k in Kind)


class OnTimeout(enum.StrEnum):
    FAIL = "fail"  # the run fails, its reason naming the wait
    ESCALATE = "escalate"  # the run stops for staff
    CONTINUE = "continue"  # the wait completes with None


class OnReject(enum.StrEnum):
    CANCEL = "cancel"  # the run ends cancelled, giving back what it holds
    CONTINUE = "continue"  # later steps see approved: False


class OnChildFailure(enum.StrEnum):
    FAIL = "fail"  # a child that failed or was cancelled fails the run, its reason naming the child
    CONTINUE = "continue"  # the join completes; its result shows each child's status


# A join waiting for its children is due again at least this often: a child's end makes it due at once
# (store.children.wake_parent), and this recheck finds the children ended from the record alone should that wake be lost
# (a worker killed between a child's end and its parent's wake). Its cost: one claim per waiting join this often.
JOIN_RECHECK = timedelta(minutes=1)

# A child run in one of these may still move (an escalated child holds the join until staff decide it).
CHILD_OPEN = frozenset({"pending", "running", "waiting", "needs_decision"})


class Move(enum.StrEnum):
    BEGIN = "begin"  # record the wait's attempt (what it waits for, until when) and wait
    WAIT = "wait"  # nothing came yet: hand the run back, waiting until `until` (None: until something is sent)
    COMPLETE = "complete"  # record the wait completed with `result` (consuming `event_id`, if any)
    FAIL = "fail"  # the run fails
    ESCALATE = "escalate"  # open an escalation on the wait's attempt and stop for staff
    HOLD = "hold"  # stop for staff (an escalation is open, or an approval is overdue)
    CANCEL = "cancel"  # the run ends cancelled


@dataclass(frozen=True, kw_only=True)
class Wait:
    """A declared wait: its kind and what to do when it times out or is rejected."""

    kind: Kind
    event: str = ""  # wait_for: the event's name
    timeout: timedelta | None = None
    on_timeout: OnTimeout = OnTimeout.FAIL
    on_reject: OnReject = OnReject.CANCEL
    on_child_failure: OnChildFailure = OnChildFailure.FAIL  # join


@dataclass(frozen=True, kw_only=True)
class Child:
    """A child run as a join sees it: its status, and (once the join settles) its results by step."""

    run_id: str
    status: str
    reason: str = ""
    results: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Event:
    """The oldest event of the wait's name sent to the run and not consumed yet."""

    id: int
    payload: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A staff decision on an approval's attempt."""

    approved: bool
    by: str
    note: str
    at: datetime


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What the record says about a wait step when a worker reaches it."""

    now: datetime  # the database's
    attempt: StepAttempt | None = None  # the wait's latest attempt (started: it waits; None: not begun)
    asked: datetime | timedelta | None = None  # a sleep not begun: its `until` or duration, as its function said
    event: Event | None = None
    decision: Decision | None = None
    staff: str = ""  # the decision on an escalation of this attempt: happened | did_not_happen | abandon
    escalation_open: bool = False
    children: tuple[Child, ...] = ()  # a join: every child run the run started, in run_id order


@dataclass(frozen=True, kw_only=True)
class Next:
    move: Move
    until: datetime | None = None
    result: Any = None
    event_id: int | None = None
    detail: Mapping[str, Any] | None = None  # BEGIN: what the attempt records
    resolution: str = ""  # COMPLETE: how it came to be completed
    reason: str = ""
    fresh: bool = False  # about a new attempt (the wait not begun, or begun again), not the one begun


def iso(when: datetime) -> str:
    return when.isoformat()


def recorded_until(attempt: StepAttempt) -> datetime | None:
    """The wake time or deadline a begun wait recorded (None: it waits with no deadline)."""
    text = (attempt.progress or {}).get("until")
    return datetime.fromisoformat(text) if isinstance(text, str) else None


def _begin(wait: Wait, step: str, facts: Facts) -> Next:
    if wait.kind is Kind.SLEEP:
        asked = facts.asked
        if asked is None:
            raise ValueError(f"{step}: a sleep begins with its duration or until time")
        until = asked if isinstance(asked, datetime) else facts.now + asked
        if until <= facts.now:
            return Next(
                fresh=True,
                move=Move.COMPLETE,
                result={"until": iso(until)},
                resolution="timer",
                reason=f"{step}: its wake time {iso(until)} has passed already",
            )
        return Next(
            fresh=True,
            move=Move.BEGIN,
            until=until,
            detail={"until": iso(until), "kind": wait.kind.value},
            reason=f"{step}: sleeping",
        )
    if wait.kind is Kind.WAIT_FOR and facts.event is not None:
        return Next(
            fresh=True,
            move=Move.COMPLETE,
            result=dict(facts.event.payload),
            event_id=facts.event.id,
            resolution="event",
            reason=f"{step}: event {wait.event!r} was sent before the run got here",
        )
    deadline = facts.now + wait.timeout if wait.timeout is not None else None
    detail: dict[str, Any] = {"until": iso(deadline) if deadline else None, "kind": wait.kind.value}
    if wait.kind is Kind.WAIT_FOR:
        detail["event"] = wait.event
    return Next(fresh=True, move=Move.BEGIN, until=deadline, detail=detail, reason=f"{step}: waiting")


def _timed_out(wait: Wait, step: str, attempt: StepAttempt, until: datetime) -> Next:
    what = f"event {wait.event!r}" if wait.kind is Kind.WAIT_FOR else "a decision"
    since = attempt.started_at
    reason = f"{step}: no {what} {'since ' + iso(since) + ', ' if since else ''}timed out at {iso(until)}"
    if wait.on_timeout is OnTimeout.CONTINUE:
        return Next(move=Move.COMPLETE, result=None, resolution="timeout", reason=reason)
    if wait.on_timeout is OnTimeout.FAIL:
        return Next(move=Move.FAIL, reason=reason)
    if wait.kind is Kind.APPROVAL:  # the approval stays open: staff approve or reject it, or cancel the run
        return Next(move=Move.HOLD, reason=f"{reason}; waiting for staff to decide it")
    return Next(
        move=Move.ESCALATE,
        reason=f"{reason}; staff decide: happened (with the payload), did_not_happen (wait again), or abandon",
    )


def next_move(wait: Wait, step: str, facts: Facts) -> Next:
    """Say, from the record alone, the one thing to do about the wait step `step` now."""
    if wait.kind is Kind.JOIN:
        return _join(wait, step, facts)
    attempt = facts.attempt
    if attempt is None or attempt.status != "started":
        return _begin(wait, step, facts)
    if wait.kind is Kind.WAIT_FOR:
        if facts.staff == "did_not_happen":  # staff said it did not come: wait again, for another timeout
            return _begin(wait, step, replace_event(facts))
        if facts.staff == "abandon":
            return Next(move=Move.CANCEL, reason=f"staff abandoned the run at {step}")
        if facts.escalation_open:
            return Next(move=Move.HOLD, reason=f"{step} timed out and awaits a staff decision")
        if facts.event is not None:
            return Next(
                move=Move.COMPLETE,
                result=dict(facts.event.payload),
                event_id=facts.event.id,
                resolution="event",
                reason=f"{step}: event {wait.event!r} came",
            )
    if wait.kind is Kind.APPROVAL and facts.decision is not None:
        d = facts.decision
        result = {"approved": d.approved, "by": d.by, "note": d.note, "at": iso(d.at)}
        if not d.approved and wait.on_reject is OnReject.CANCEL:
            return Next(move=Move.CANCEL, result=result, reason=f"{step} rejected by {d.by}: {d.note}")
        return Next(
            move=Move.COMPLETE,
            result=result,
            resolution="decision",
            reason=f"{step} {'approved' if d.approved else 'rejected'} by {d.by}",
        )
    until = recorded_until(attempt)
    if wait.kind is Kind.SLEEP:
        if until is None or facts.now >= until:
            return Next(
                move=Move.COMPLETE,
                result={"until": iso(until) if until else None},
                resolution="timer",
                reason=f"{step}: slept until {iso(until) if until else '?'}",
            )
        return Next(move=Move.WAIT, until=until, reason=f"{step}: sleeping until {iso(until)}")
    if until is not None and facts.now >= until:
        return _timed_out(wait, step, attempt, until)
    return Next(move=Move.WAIT, until=until, reason=f"{step}: waiting")


def open_children(children: Sequence[Child]) -> tuple[Child, ...]:
    """The children that may still move."""
    return tuple(c for c in children if c.status in CHILD_OPEN)


def join_settles(wait: Wait, attempt: StepAttempt | None, children: Sequence[Child], now: datetime) -> bool:
    """Whether the join completes or fails now (every child ended, or its deadline passed): then, and only then,
    the children's results are read for it."""
    if not open_children(children):
        return True
    until = recorded_until(attempt) if attempt is not None and attempt.status == "started" else None
    return until is not None and now >= until


def join_result(children: Sequence[Child]) -> dict[str, Any]:
    """ctx.results of a join: each child's run_id -> {"status": ..., "results": {step: result}}."""
    return {c.run_id: {"status": c.status, "results": dict(c.results or {})} for c in children}


def _join(wait: Wait, step: str, facts: Facts) -> Next:
    """The join rule: wait while a child may still move; once none can, complete with every child's status and
    results, or fail naming the first child that did not complete (on_child_failure="fail"). A deadline
    (timeout=, from when the join began, on the database's clock) fails the run or completes with the children
    as they stand (on_timeout="continue"), the unfinished ones with their status."""
    begun = facts.attempt if facts.attempt is not None and facts.attempt.status == "started" else None
    children = facts.children
    waiting = open_children(children)
    if not waiting:
        failed = [c for c in children if c.status != "completed"]
        if failed and wait.on_child_failure is OnChildFailure.FAIL:
            first = failed[0]
            why = f": {first.reason}" if first.reason else ""
            more = f" (and {len(failed) - 1} more child run(s) did not complete)" if len(failed) > 1 else ""
            return Next(
                fresh=begun is None,
                move=Move.FAIL,
                reason=f"{step}: child run {first.run_id} {first.status}{why}{more}",
            )
        return Next(
            fresh=begun is None,
            move=Move.COMPLETE,
            result=join_result(children),
            resolution="children",
            reason=f"{step}: {len(children)} child run(s) ended",
        )
    recheck = facts.now + JOIN_RECHECK
    if begun is None:
        deadline = facts.now + wait.timeout if wait.timeout is not None else None
        return Next(
            fresh=True,
            move=Move.BEGIN,
            until=min(deadline, recheck) if deadline else recheck,
            detail={"until": iso(deadline) if deadline else None, "kind": wait.kind.value},
            reason=f"{step}: waiting for {len(waiting)} child run(s)",
        )
    until = recorded_until(begun)
    if until is not None and facts.now >= until:
        names = ", ".join(c.run_id for c in waiting[:3]) + (" ..." if len(waiting) > 3 else "")
        reason = f"{step}: {len(waiting)} child run(s) unfinished ({names}) when the join timed out at {iso(until)}"
        if wait.on_timeout is OnTimeout.CONTINUE:
            return Next(move=Move.COMPLETE, result=join_result(children), resolution="timeout", reason=reason)
        return Next(move=Move.FAIL, reason=reason)
    return Next(
        move=Move.WAIT,
        until=min(until, recheck) if until else recheck,
        reason=f"{step}: waiting for {len(waiting)} child run(s)",
    )


def replace_event(facts: Facts) -> Facts:
    """The facts of a wait begun again: a new attempt, with whatever event is kept for it."""
    return Facts(now=facts.now, event=facts.event)


# A failed attempt whose error starts so is one where the step's when= raised: nothing acted, and when= is asked
# again on the next attempt. One where a sleep's time raised (TIME_RAISED) was asked after its when= said True:
# that answer stands, and only the time is asked again.
ASKING_RAISED = "asking raised: "
TIME_RAISED = "asking its time raised: "


def needs_asking(attempts: Sequence[StepAttempt]) -> bool:
    """Whether a step's when= is still to be asked: no attempt of it got past the question (its answer is
    recorded by the first attempt that did: a skip, an intent, or a begun wait)."""
    return all(a.status == "failed" and a.error.startswith(ASKING_RAISED) for a in attempts)
