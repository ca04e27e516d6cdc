"""durableruns.waits: each wait kind's next move from the record alone, as tables; the declarations it refuses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durableruns import Workflow
from durableruns.boundary import StepAttempt, compute_boundary
from durableruns.errors import DeclarationError
from durableruns.waits import (
    JOIN_RECHECK,
    Child,
    Decision,
    Event,
    Facts,
    Kind,
    Move,
    OnChildFailure,
    OnReject,
    OnTimeout,
    Wait,
    join_settles,
    needs_asking,
    next_move,
)

T0 = datetime(2026, 12, 2, 14, 7, tzinfo=UTC)
HOUR = timedelta(hours=1)


def begun(until: datetime | None, *, attempt: int = 1, event: str = "") -> StepAttempt:
    progress: dict[str, object] = {"until": until.isoformat() if until else None}
    if event:
        progress["event"] = event
    return StepAttempt(step="w", attempt=attempt, status="started", started_at=T0, progress=progress)


SLEEP = Wait(kind=Kind.SLEEP)
FOR = Wait(kind=Kind.WAIT_FOR, event="go", timeout=HOUR, on_timeout=OnTimeout.FAIL)
FOR_ESCALATE = Wait(kind=Kind.WAIT_FOR, event="go", timeout=HOUR, on_timeout=OnTimeout.ESCALATE)
FOR_CONTINUE = Wait(kind=Kind.WAIT_FOR, event="go", timeout=HOUR, on_timeout=OnTimeout.CONTINUE)
FOR_EVER = Wait(kind=Kind.WAIT_FOR, event="go")
APPROVAL = Wait(kind=Kind.APPROVAL, timeout=HOUR, on_timeout=OnTimeout.ESCALATE, on_reject=OnReject.CANCEL)
APPROVAL_GOES_ON = Wait(kind=Kind.APPROVAL, on_reject=OnReject.CONTINUE)
EVENT = Event(id=7, payload={"ref": "S1"})
YES = Decision(approved=True, by="ann", note="fine", at=T0)
NO = Decision(approved=False, by="bob", note="too dear", at=T0)


@pytest.mark.parametrize(
    ("wait", "facts", "move", "until", "result", "fresh"),
    [
        # a sleep begins with its wake time computed once from the database's now, and records it
        (SLEEP, Facts(now=T0, asked=HOUR), Move.BEGIN, T0 + HOUR, None, True),
        (SLEEP, Facts(now=T0, asked=T0 + 2 * HOUR), Move.BEGIN, T0 + 2 * HOUR, None, True),
        (SLEEP, Facts(now=T0, asked=T0 - HOUR), Move.COMPLETE, None, {"until": (T0 - HOUR).isoformat()}, True),
        # once begun, the recorded time decides; whatever it would be asked now is not asked
        (SLEEP, Facts(now=T0 + HOUR / 2, attempt=begun(T0 + HOUR)), Move.WAIT, T0 + HOUR, None, False),
        (SLEEP, Facts(now=T0 + HOUR, attempt=begun(T0 + HOUR)), Move.COMPLETE, None,
         {"until": (T0 + HOUR).isoformat()}, False),
        # a wait for an event: an event kept from before completes it at once, consuming it
        (FOR, Facts(now=T0, event=EVENT), Move.COMPLETE, None, {"ref": "S1"}, True),
        (FOR, Facts(now=T0), Move.BEGIN, T0 + HOUR, None, True),
        (FOR_EVER, Facts(now=T0), Move.BEGIN, None, None, True),
        (FOR, Facts(now=T0 + HOUR / 2, attempt=begun(T0 + HOUR, event="go")), Move.WAIT, T0 + HOUR, None, False),
        (FOR, Facts(now=T0 + HOUR / 2, attempt=begun(T0 + HOUR, event="go"), event=EVENT), Move.COMPLETE, None,
         {"ref": "S1"}, False),
        (FOR_EVER, Facts(now=T0 + 1000 * HOUR, attempt=begun(None, event="go")), Move.WAIT, None, None, False),
        # timeouts, by mode
        (FOR, Facts(now=T0 + HOUR, attempt=begun(T0 + HOUR, event="go")), Move.FAIL, None, None, False),
        (FOR_ESCALATE, Facts(now=T0 + HOUR, attempt=begun(T0 + HOUR, event="go")), Move.ESCALATE, None, None,
         False),
        (FOR_CONTINUE, Facts(now=T0 + HOUR, attempt=begun(T0 + HOUR, event="go")), Move.COMPLETE, None, None,
         False),
        # an event that came after the deadline but before the worker looked still completes the wait
        (FOR, Facts(now=T0 + 2 * HOUR, attempt=begun(T0 + HOUR, event="go"), event=EVENT), Move.COMPLETE, None,
         {"ref": "S1"}, False),
        # after an escalation: open holds; did_not_happen waits again for another timeout; abandon cancels
        (FOR_ESCALATE, Facts(now=T0 + HOUR, attempt=begun(T0 + HOUR, event="go"), escalation_open=True),
         Move.HOLD, None, None, False),
        (FOR_ESCALATE, Facts(now=T0 + 3 * HOUR, attempt=begun(T0 + HOUR, event="go"), staff="did_not_happen"),
         Move.BEGIN, T0 + 4 * HOUR, None, True),
        (FOR_ESCALATE, Facts(now=T0 + 3 * HOUR, attempt=begun(T0 + HOUR, event="go"), staff="abandon"),
         Move.CANCEL, None, None, False),
        # approvals
        (APPROVAL, Facts(now=T0), Move.BEGIN, T0 + HOUR, None, True),
        (APPROVAL_GOES_ON, Facts(now=T0), Move.BEGIN, None, None, True),
        (APPROVAL, Facts(now=T0, attempt=begun(T0 + HOUR)), Move.WAIT, T0 + HOUR, None, False),
        (APPROVAL, Facts(now=T0, attempt=begun(T0 + HOUR), decision=YES), Move.COMPLETE, None,
         {"approved": True, "by": "ann", "note": "fine", "at": T0.isoformat()}, False),
        (APPROVAL, Facts(now=T0, attempt=begun(T0 + HOUR), decision=NO), Move.CANCEL, None,
         {"approved": False, "by": "bob", "note": "too dear", "at": T0.isoformat()}, False),
        (APPROVAL_GOES_ON, Facts(now=T0, attempt=begun(None), decision=NO), Move.COMPLETE, None,
         {"approved": False, "by": "bob", "note": "too dear", "at": T0.isoformat()}, False),
        (APPROVAL, Facts(now=T0 + HOUR, attempt=begun(T0 + HOUR)), Move.HOLD, None, None, False),
        # a decision recorded while overdue still counts
        (APPROVAL, Facts(now=T0 + 5 * HOUR, attempt=begun(T0 + HOUR), decision=YES), Move.COMPLETE, None,
         {"approved": True, "by": "ann", "note": "fine", "at": T0.isoformat()}, False),
    ],
)
def test_next_move(wait, facts, move, until, result, fresh):
    got = next_move(wait, "w", facts)
    assert (got.move, got.until, got.result, got.fresh) == (move, until, result, fresh), got


def test_a_begun_wait_records_what_it_waits_for_and_until_when():
    got = next_move(FOR, "w", Facts(now=T0))
    assert got.detail == {"until": (T0 + HOUR).isoformat(), "event": "go", "kind": "wait_for"}
    slept = next_move(SLEEP, "w", Facts(now=T0, asked=HOUR)).detail
    assert slept == {"until": (T0 + HOUR).isoformat(), "kind": "sleep"}


def test_an_event_consumed_is_named_and_a_timeout_reason_names_the_wait():
    assert next_move(FOR, "w", Facts(now=T0, event=EVENT)).event_id == 7
    failed = next_move(FOR, "supplier_confirmed", Facts(now=T0 + HOUR, attempt=begun(T0 + HOUR, event="go")))
    assert "supplier_confirmed" in failed.reason and "'go'" in failed.reason
    rejected = next_move(APPROVAL, "manager_approval", Facts(now=T0, attempt=begun(None), decision=NO))
    assert "bob" in rejected.reason and "too dear" in rejected.reason


@pytest.mark.parametrize(
    ("attempts", "asks"),
    [
        ([], True),
        ([StepAttempt(step="s", attempt=1, status="failed", error="asking raised: ValueError")], True),
        ([StepAttempt(step="s", attempt=1, status="failed", error="asking its time raised: ValueError")], False),
        ([StepAttempt(step="s", attempt=1, status="failed", error="Rejected: no")], False),
        ([StepAttempt(step="s", attempt=1, status="completed")], False),
        ([StepAttempt(step="s", attempt=1, status="started")], False),
    ],
)
def test_when_is_asked_until_an_attempt_records_its_answer(attempts, asks):
    assert needs_asking(attempts) is asks


def test_a_begun_wait_is_waiting_not_in_doubt_and_the_sentence_says_for_what_and_until_when():
    attempts = [
        StepAttempt(step="a", attempt=1, status="completed"),
        begun(T0 + 48 * HOUR, event="go"),
    ]
    b = compute_boundary(("a", "w", "z"), attempts, waits={"w": "wait_for"})
    assert b.in_doubt == [] and dict(b.waiting) == {"w": "wait_for"}
    assert b.sentence(UTC) == (
        "1 step complete, waiting for w since 14:07 (times out 2026-12-04 14:07), 2 steps remaining")
    slept = compute_boundary(("w",), [begun(T0 + HOUR)], waits={"w": "sleep"})
    assert slept.sentence(UTC) == "0 steps complete, w sleeping until 2026-12-02 15:07, 1 step remaining"
    asked = compute_boundary(("w",), [begun(None)], waits={"w": "approval"})
    assert asked.sentence(UTC) == "0 steps complete, waiting for approval w since 14:07, 1 step remaining"
    from dataclasses import replace

    assert replace(asked, status="cancelled").sentence(UTC) == "0 steps complete, w stopped waiting, 1 step remaining"
    # without the plan's kinds a started row is in doubt, as before
    assert compute_boundary(("w",), [begun(None)]).in_doubt == ["w"]


# -- declarations -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "declare",
    [
        lambda wf: wf.sleep("s", timedelta(0)),
        lambda wf: wf.sleep("s", timedelta(seconds=-1)),
        lambda wf: wf.sleep("s"),
        lambda wf: wf.sleep("s", HOUR, until=lambda ctx: T0),
        lambda wf: wf.sleep("s", 5),
        lambda wf: wf.wait_for("w", timeout=timedelta(0)),
        lambda wf: wf.wait_for("w", timeout=timedelta(seconds=-5)),
        lambda wf: wf.wait_for("w", timeout=HOUR, on_timeout="retry"),
        lambda wf: wf.wait_for("w", on_timeout="escalate"),
        lambda wf: wf.approval("a", timeout=timedelta(0)),
        lambda wf: wf.approval("a", on_reject="ignore"),
        lambda wf: wf.approval("a", when=True),
        lambda wf: wf.step(policy="re_executable", when="yes"),
    ],
)
def test_bad_waits_are_declaration_errors(declare):
    with pytest.raises(DeclarationError):
        declare(Workflow("unit_bad_waits", replace=True))


def test_wait_steps_are_in_the_plan_and_its_fingerprint():
    def build(kind: str) -> Workflow:
        wf = Workflow("unit_waits_fp", replace=True)

        @wf.step(policy="re_executable")
        def a(ctx):
            return {}

        if kind == "sleep":
            wf.sleep("w", HOUR)
        elif kind == "wait_for":
            wf.wait_for("w")
        else:
            wf.approval("w")
        return wf

    plans = {kind: build(kind).as_plan() for kind in ("sleep", "wait_for", "approval")}
    assert plans["sleep"].steps == (("a", "re_executable"), ("w", "sleep"))
    assert len({p.fingerprint for p in plans.values()}) == 3
    assert plans["approval"].waits == {"w": "approval"}
    twice = Workflow("unit_waits_twice", replace=True)
    twice.sleep("w", HOUR)
    with pytest.raises(DeclarationError):
        twice.wait_for("w")


# -- the join: every child run ended, or its deadline -------------------------------------------------------------

JOIN = Wait(kind=Kind.JOIN)
JOIN_CONTINUE = Wait(kind=Kind.JOIN, on_child_failure=OnChildFailure.CONTINUE)
JOIN_TIMED = Wait(kind=Kind.JOIN, timeout=HOUR)
JOIN_TIMED_CONTINUE = Wait(kind=Kind.JOIN, timeout=HOUR, on_timeout=OnTimeout.CONTINUE)


def kids(*statuses: str) -> tuple[Child, ...]:
    return tuple(Child(run_id=f"p/s/{n}", status=s, reason=f"why {n}", results={"a": n})
                 for n, s in enumerate(statuses))


@pytest.mark.parametrize(("wait", "attempt", "children", "now", "move", "until"), [
    # not begun: children still moving -> begin, due again at the recheck (or the deadline, if sooner); none ->
    # complete at once
    (JOIN, None, kids("pending", "completed"), T0, Move.BEGIN, T0 + JOIN_RECHECK),
    (JOIN_TIMED, None, kids("running"), T0, Move.BEGIN, T0 + JOIN_RECHECK),
    (JOIN_TIMED, None, kids("running"), T0 + HOUR - JOIN_RECHECK / 2, Move.BEGIN, T0 + HOUR + JOIN_RECHECK / 2),
    (JOIN, None, (), T0, Move.COMPLETE, None),
    (JOIN, None, kids("completed", "completed"), T0, Move.COMPLETE, None),
    # begun: an escalated or waiting child holds it; every child ended -> complete, or fail on a failure
    (JOIN, begun(None), kids("completed", "needs_decision"), T0, Move.WAIT, T0 + JOIN_RECHECK),
    (JOIN_TIMED, begun(T0 + HOUR), kids("waiting"), T0, Move.WAIT, T0 + JOIN_RECHECK),
    (JOIN_TIMED, begun(T0 + HOUR), kids("waiting"), T0 + HOUR - JOIN_RECHECK / 2, Move.WAIT, T0 + HOUR),
    (JOIN, begun(None), kids("completed", "completed"), T0, Move.COMPLETE, None),
    (JOIN, begun(None), kids("completed", "failed"), T0, Move.FAIL, None),
    (JOIN, begun(None), kids("cancelled", "completed"), T0, Move.FAIL, None),
    (JOIN_CONTINUE, begun(None), kids("completed", "failed"), T0, Move.COMPLETE, None),
    # the deadline, on the database's clock: fail, or go on with the children as they stand
    (JOIN_TIMED, begun(T0 + HOUR), kids("running"), T0 + HOUR, Move.FAIL, None),
    (JOIN_TIMED_CONTINUE, begun(T0 + HOUR), kids("running", "completed"), T0 + HOUR, Move.COMPLETE, None),
    # every child ended by the deadline: they decide, not the clock
    (JOIN_TIMED, begun(T0 + HOUR), kids("completed"), T0 + 2 * HOUR, Move.COMPLETE, None),
])
def test_the_join_rule(wait, attempt, children, now, move, until):
    nxt = next_move(wait, "join", Facts(now=now, attempt=attempt, children=children))
    assert (nxt.move, nxt.until) == (move, until)
    assert nxt.fresh == (attempt is None)
    assert join_settles(wait, attempt, children, now) == (move in (Move.COMPLETE, Move.FAIL))


def test_a_begun_join_records_its_deadline_not_its_recheck():
    nxt = next_move(JOIN_TIMED, "j", Facts(now=T0, children=kids("running")))
    assert nxt.detail == {"until": (T0 + HOUR).isoformat(), "kind": "join"}
    assert next_move(JOIN, "j", Facts(now=T0, children=kids("running"))).detail == {"until": None, "kind": "join"}


def test_a_join_result_maps_each_child_to_its_status_and_results_and_a_failure_names_the_child():
    done = next_move(JOIN_CONTINUE, "bookings",
                     Facts(now=T0, attempt=begun(None), children=kids("completed", "failed")))
    assert done.result == {"p/s/0": {"status": "completed", "results": {"a": 0}},
                           "p/s/1": {"status": "failed", "results": {"a": 1}}}
    assert done.resolution == "children"
    failed = next_move(JOIN, "bookings", Facts(now=T0, attempt=begun(None), children=kids("failed", "cancelled")))
    assert failed.reason == "bookings: child run p/s/0 failed: why 0 (and 1 more child run(s) did not complete)"
    late = next_move(JOIN_TIMED_CONTINUE, "bookings", Facts(now=T0 + HOUR, attempt=begun(T0 + HOUR),
                                                            children=kids("needs_decision")))
    assert late.result == {"p/s/0": {"status": "needs_decision", "results": {"a": 0}}}
    assert late.resolution == "timeout" and "p/s/0" in late.reason


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"on_timeout": "escalate", "timeout": HOUR}, "fail or continue"),
    ({"on_timeout": "continue"}, "needs a timeout"),
    ({"on_child_failure": "ignore"}, "on_child_failure must be one of fail, continue"),
    ({"timeout": timedelta(0)}, "must be a positive timedelta"),
])
def test_bad_joins_are_declaration_errors(kwargs, message):
    with pytest.raises(DeclarationError, match=message):
        Workflow("unit_join_bad", replace=True).join("j", **kwargs)


def test_a_join_is_in_the_plan_as_a_join():
    flow = Workflow("unit_join_plan", replace=True)
    flow.join("children", timeout=HOUR)
    assert flow.plan_steps == (("children", "join"),) and flow.as_plan().waits == {"children": "join"}
