"""Runs that wait, worked in-process on the real database (PostgreSQL, and SQLite: no test here needs row locks).

The database's clock is moved with Clock(shift=...) to pass a wake time or a deadline, uniformly in every
statement of the pass."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction

import durableruns
from durableruns import Workflow, services, store
from durableruns.clock import Clock
from durableruns.errors import (
    AlreadyDecided,
    ApprovalNotFound,
    FencedOut,
    InvalidInput,
    RunNotActionable,
    RunNotFound,
)
from durableruns.models import Escalation, Intervention, Resolution, RunEvent, RunState, RunStatus, RunStep
from tests.conftest import Workers

pytestmark = pytest.mark.django_db(transaction=True)


def later(seconds: float) -> Clock:
    return Clock(shift=timedelta(seconds=seconds))


def resume(seconds: float = 0) -> None:
    services.resume_due(clock=later(seconds))


def run(run_id: str) -> RunState:
    return RunState.objects.get(pk=run_id)


def rows(run_id: str, step: str) -> list[RunStep]:
    return list(RunStep.objects.filter(run_id=run_id, step=step).order_by("attempt"))


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


# -- sleep ----------------------------------------------------------------------------------------------------


def test_a_sleep_records_its_wake_time_once_holds_nothing_and_wakes_on_it():
    run_id = durableruns.start("sleeper", {"seconds": 60})
    resume()
    waiting = run(run_id)
    (nap,) = rows(run_id, "nap")
    until = nap.progress["until"]
    assert waiting.status == RunStatus.WAITING and waiting.lease_expires_at is None and nap.status == "started"
    assert abs((waiting.wake_at - nap.started_at).total_seconds() - 60) < 1
    assert "nap sleeping until" in str(durableruns.boundary(run_id))
    resume(30)  # not due: nothing claimed, nothing computed again
    assert run(run_id).status == RunStatus.WAITING and rows(run_id, "nap")[0].progress["until"] == until
    resume(61)
    assert run(run_id).status == RunStatus.COMPLETED
    (nap,) = rows(run_id, "nap")
    assert nap.status == "completed" and nap.resolution == Resolution.TIMER and nap.result == {"until": until}
    assert rows(run_id, "woke")[0].result == {"slept": {"until": until}}


def test_a_resume_reads_the_recorded_wake_time_back_even_if_the_sleep_would_now_say_otherwise():
    run_id = durableruns.start("sleeper", {"seconds": 60})
    resume()
    until = rows(run_id, "nap")[0].progress["until"]
    RunState.objects.filter(pk=run_id).update(input={"seconds": 1}, wake_at=None, status=RunStatus.PENDING)
    resume(5)  # claimed early (as after a crash): the record says 60 s, the input now says 1 s
    assert run(run_id).status == RunStatus.WAITING and rows(run_id, "nap")[0].progress["until"] == until
    assert len(rows(run_id, "nap")) == 1


# -- wait_for and send ----------------------------------------------------------------------------------------


def test_an_event_completes_the_wait_in_the_commit_that_consumes_it(far):
    run_id = durableruns.start("waiting", {"total": 5, "cool_off": 0.01})
    resume()
    assert run(run_id).status == RunStatus.WAITING and "waiting for supplier_confirmed" in str(
        durableruns.boundary(run_id))
    assert run(run_id).wake_at is not None  # its deadline
    assert durableruns.send(run_id, "supplier_confirmed", {"ref": "S1", "backorder": False}) is True
    assert run(run_id).wake_at <= Clock().now()  # due at once
    resume()
    resume(1)  # past the cool-off
    assert run(run_id).status == RunStatus.COMPLETED
    (event,) = RunEvent.objects.filter(run_id=run_id)
    (wait,) = rows(run_id, "supplier_confirmed")
    assert (event.consumed_step, event.consumed_attempt) == ("supplier_confirmed", 1)
    assert wait.result == {"ref": "S1", "backorder": False} and wait.resolution == Resolution.EVENT
    assert rows(run_id, "notify_buyer")[0].result["saw"] == {"ref": "S1", "backorder": False}
    assert far.email.count() == 1
    # the approval's when= said no (5 <= 10 000): recorded skipped, its result None
    (approval,) = rows(run_id, "manager_approval")
    assert approval.resolution == Resolution.SKIPPED and approval.result is None


def test_events_sent_early_are_kept_and_consumed_oldest_first_one_per_wait():
    run_id = durableruns.start("waits_continue", {})
    assert durableruns.send(run_id, "go", {"n": 1})
    assert durableruns.send(run_id, "go", {"n": 2})
    assert durableruns.send(run_id, "other", {"n": 3})  # an event the run never waits for: kept, shown
    resume()
    assert run(run_id).status == RunStatus.COMPLETED
    assert rows(run_id, "after")[0].result == {"signal": {"n": 1}}
    left = list(RunEvent.objects.filter(run_id=run_id, consumed_at__isnull=True).values_list("event", "payload"))
    assert left == [("go", {"n": 2}), ("other", {"n": 3})]


def test_an_event_the_run_does_not_wait_for_completes_nothing_and_wakes_nothing():
    run_id = durableruns.start("waits_fail", {})
    resume()
    wake_at = run(run_id).wake_at
    assert durableruns.send(run_id, "signal", {"x": 1})  # the step's name, not its event's ("go")
    assert run(run_id).wake_at == wake_at and run(run_id).status == RunStatus.WAITING
    resume()
    assert rows(run_id, "signal")[0].status == "started"


@pytest.mark.parametrize("begun", [True, False], ids=["begun", "reached-with-the-event-there"])
def test_a_completion_whose_event_was_consumed_meanwhile_records_nothing(begun):
    """The wait's result, the moved cursor and the event's consumption are one commit: the event gone, none is
    recorded (FencedOut), whether the wait had begun or completes as it is reached."""
    run_id = durableruns.start("waits_continue", {})
    if begun:
        resume()  # the wait begins: its started attempt
    assert durableruns.send(run_id, "go", {"n": 1})
    claimed = store.claim(owner="test", lease_seconds=30, run_id=run_id)
    assert claimed is not None
    before = run(run_id).cursor
    _now, (event_id, payload) = store.now_and_oldest_event(run_id, "go")
    assert payload == {"n": 1}
    RunEvent.objects.filter(pk=event_id).update(consumed_step="elsewhere", consumed_attempt=1,
                                                consumed_at=Clock().now())
    with pytest.raises(FencedOut):
        store.complete_wait(claimed.lease, step="signal", attempt=1, begun=begun, effect_key=f"{run_id}:signal",
                            result=payload, resolution=Resolution.EVENT, cursor=1, event_id=event_id)
    assert [(r.status, r.result) for r in rows(run_id, "signal")] == ([("started", None)] if begun else [])
    assert run(run_id).cursor == before
    assert RunEvent.objects.get(pk=event_id).consumed_step == "elsewhere"
    # with the event there, the same completion records all three
    RunEvent.objects.filter(pk=event_id).update(consumed_step="", consumed_attempt=None, consumed_at=None)
    store.complete_wait(claimed.lease, step="signal", attempt=1, begun=begun, effect_key=f"{run_id}:signal",
                        result=payload, resolution=Resolution.EVENT, cursor=1, event_id=event_id)
    assert [(r.status, r.result) for r in rows(run_id, "signal")] == [("completed", {"n": 1})]
    assert run(run_id).cursor == 1
    assert RunEvent.objects.get(pk=event_id).consumed_step == "signal"


def test_a_key_records_an_event_once():
    run_id = durableruns.start("waits_continue", {})
    assert durableruns.send(run_id, "go", {"n": 1}, key="webhook-1") is True
    assert durableruns.send(run_id, "go", {"n": 99}, key="webhook-1") is False
    assert list(RunEvent.objects.filter(run_id=run_id).values_list("payload", flat=True)) == [{"n": 1}]


def test_send_refuses_unknown_and_ended_runs_and_bad_payloads():
    with pytest.raises(RunNotFound):
        durableruns.send("no-such-run", "go", {})
    run_id = durableruns.start("waits_continue", {})
    durableruns.send(run_id, "go")
    resume()
    assert run(run_id).status == RunStatus.COMPLETED
    with pytest.raises(RunNotActionable):
        durableruns.send(run_id, "go", {"late": True})
    other = durableruns.start("waits_continue", {})
    for bad in ([1, 2], "text", {"when": object()}, {"nan": float("nan")}, {"nul": "a\x00b"}):
        with pytest.raises(InvalidInput):
            durableruns.send(other, "go", bad)
    with pytest.raises(InvalidInput):
        durableruns.send(other, "", {})
    assert RunEvent.objects.filter(run_id__in=[run_id, other]).count() == 1


def test_send_inside_the_callers_transaction_exists_exactly_when_their_records_do():
    run_id = durableruns.start("waits_continue", {})
    with pytest.raises(RuntimeError), transaction.atomic():
        durableruns.send(run_id, "go", {"n": 1}, key="k")
        raise RuntimeError("the caller's own write failed")
    assert not RunEvent.objects.filter(run_id=run_id).exists()
    with transaction.atomic():
        assert durableruns.send(run_id, "go", {"n": 2}, key="k") is True
        assert durableruns.send(run_id, "go", {"n": 3}, key="k") is False  # the savepoint kept the caller's
    assert list(RunEvent.objects.filter(run_id=run_id).values_list("payload", flat=True)) == [{"n": 2}]


# -- timeouts ---------------------------------------------------------------------------------------------------


def test_on_timeout_fail_fails_the_run_naming_the_wait():
    run_id = durableruns.start("waits_fail", {})
    resume()
    resume(61)
    failed = run(run_id)
    assert failed.status == RunStatus.FAILED and "signal" in failed.reason and "'go'" in failed.reason


def test_on_timeout_continue_goes_on_with_none():
    run_id = durableruns.start("waits_continue", {})
    resume()
    resume(61)
    assert run(run_id).status == RunStatus.COMPLETED
    assert rows(run_id, "signal")[0].resolution == Resolution.TIMEOUT
    assert rows(run_id, "after")[0].result == {"signal": None}


def test_on_timeout_escalate_stops_for_staff_who_wait_again_or_say_it_happened():
    run_id = durableruns.start("waits_escalate", {})
    resume()
    resume(61)
    assert run(run_id).status == RunStatus.NEEDS_DECISION
    (escalation,) = Escalation.objects.filter(run_id=run_id)
    assert escalation.step == "signal" and escalation.attempt == 1
    durableruns.decide(run_id, "signal", "did_not_happen", by="ann", note="the supplier says tomorrow")
    resume(62)
    assert run(run_id).status == RunStatus.WAITING
    again = rows(run_id, "signal")
    assert [r.attempt for r in again] == [1, 2] and again[1].status == "started"
    resume(200)  # the second wait times out too: escalated again
    assert run(run_id).status == RunStatus.NEEDS_DECISION
    durableruns.decide(run_id, "signal", "happened", by="ann", note="phoned them", result={"ref": "by phone"})
    resume(201)
    assert run(run_id).status == RunStatus.COMPLETED
    assert rows(run_id, "after")[0].result == {"signal": {"ref": "by phone"}}


def test_on_timeout_escalate_then_abandon_cancels():
    run_id = durableruns.start("waits_escalate", {})
    resume()
    resume(61)
    durableruns.decide(run_id, "signal", "abandon", by="ann", note="order withdrawn")
    resume(62)
    assert run(run_id).status == RunStatus.CANCELLED


# -- approvals --------------------------------------------------------------------------------------------------


def big_order_waiting_for_approval() -> str:
    run_id = durableruns.start("waiting", {"total": 20_000, "cool_off": 0.01})
    resume()
    assert run(run_id).status == RunStatus.WAITING
    assert "waiting for approval manager_approval" in str(durableruns.boundary(run_id))
    return run_id


def test_an_approval_is_decided_once_and_its_result_says_by_whom():
    run_id = big_order_waiting_for_approval()
    with pytest.raises(ApprovalNotFound):
        durableruns.decide(run_id, "supplier_confirmed", "approve", by="ann", note="wrong step")
    decision = durableruns.decide(run_id, "manager_approval", "approve", by="ann", note="within budget")
    assert decision.action == Intervention.Action.APPROVE and decision.attempt == 1
    with pytest.raises(AlreadyDecided):
        durableruns.decide(run_id, "manager_approval", "reject", by="bob", note="too late")
    resume()
    (approval,) = rows(run_id, "manager_approval")
    assert approval.status == "completed" and approval.resolution == Resolution.DECISION
    assert approval.result == {"approved": True, "by": "ann", "note": "within budget",
                               "at": decision.decided_at.isoformat()}
    assert "waiting for supplier_confirmed" in str(durableruns.boundary(run_id))
    with pytest.raises(AlreadyDecided):
        durableruns.decide(run_id, "manager_approval", "approve", by="ann", note="again")


def test_a_rejection_cancels_the_run_naming_who_and_why(far):
    run_id = big_order_waiting_for_approval()
    durableruns.decide(run_id, "manager_approval", "reject", by="bob", note="over budget")
    resume()
    cancelled = run(run_id)
    assert cancelled.status == RunStatus.CANCELLED and "bob" in cancelled.reason and "over budget" in cancelled.reason
    assert far.email.count() == 0


def test_an_overdue_approval_stops_for_staff_and_can_still_be_decided():
    run_id = big_order_waiting_for_approval()
    resume(3601)
    assert run(run_id).status == RunStatus.NEEDS_DECISION
    durableruns.decide(run_id, "manager_approval", "approve", by="ann", note="sorry, late")
    assert run(run_id).status == RunStatus.PENDING
    resume(3602)
    assert run(run_id).status == RunStatus.WAITING
    assert rows(run_id, "manager_approval")[0].result["approved"] is True


# -- when= ------------------------------------------------------------------------------------------------------

ANSWER = {"value": False, "asked": 0}


def _when(ctx):
    ANSWER["asked"] += 1
    return ANSWER["value"]


def _deploy() -> Workflow:
    """The same plan each time it is declared (when= is not part of the plan): a deploy that changes when='s code."""
    flow = Workflow("waits_when", replace=True)

    @flow.step(policy="re_executable", when=_when)
    def maybe(ctx):
        return {"ran": True}

    flow.approval("sign_off", when=_when)
    flow.wait_for("go")

    @flow.step(policy="re_executable")
    def last(ctx):
        return {"maybe": ctx.results["maybe"], "sign_off": ctx.results["sign_off"]}

    return flow


def test_when_is_asked_once_recorded_and_kept_across_a_deploy_that_changes_it():
    ANSWER.update(value=False, asked=0)
    before = _deploy()
    run_id = durableruns.start("waits_when", {})
    resume()
    assert ANSWER["asked"] == 2 and run(run_id).status == RunStatus.WAITING
    assert [r.resolution for r in rows(run_id, "maybe") + rows(run_id, "sign_off")] == [Resolution.SKIPPED] * 2
    ANSWER["value"] = True  # the new deploy would say yes
    after = _deploy()
    assert after.fingerprint == before.fingerprint
    durableruns.send(run_id, "go")
    resume()
    assert run(run_id).status == RunStatus.COMPLETED and ANSWER["asked"] == 2
    assert rows(run_id, "last")[0].result == {"maybe": None, "sign_off": None}


def test_an_exception_from_when_is_the_steps_error():
    flow = Workflow("waits_when_raises", replace=True)

    @flow.step(policy="re_executable", max_attempts=2, when=lambda ctx: 1 / 0)
    def never(ctx):
        return {}

    run_id = durableruns.start("waits_when_raises", {})
    resume()
    resume()
    failed = run(run_id)
    assert failed.status == RunStatus.FAILED and "ZeroDivisionError" in failed.reason
    assert [r.status for r in rows(run_id, "never")] == ["failed", "failed"]


def test_a_sleep_whose_time_raises_after_its_when_said_yes_is_not_asked_when_again():
    asked = {"when": 0, "time": 0}

    def when(ctx):
        asked["when"] += 1
        return True

    def nap(ctx):
        asked["time"] += 1
        if asked["time"] == 1:
            raise ValueError("no nap length yet")
        return timedelta(seconds=0)

    flow = Workflow("waits_sleep_time_raises", replace=True)
    flow.sleep("nap", nap, when=when)
    run_id = durableruns.start("waits_sleep_time_raises", {})
    resume()  # when= says yes, then the time raises: a failed attempt, retried
    resume()
    resume()
    assert run(run_id).status == RunStatus.COMPLETED and asked == {"when": 1, "time": 2}  # before: when 2


# -- a waiting run holds nothing ----------------------------------------------------------------------------------


def test_fifty_sleeping_runs_do_not_keep_one_worker_thread_from_a_new_run(workers: Workers):
    sleeping = [durableruns.start("sleeper", {"seconds": 600}) for _ in range(50)]
    worker = workers.start("--loop", "--concurrency", "1", "--interval", "0.2")
    deadline = time.monotonic() + 60
    while RunState.objects.filter(pk__in=sleeping, status=RunStatus.WAITING).count() < 50:
        assert time.monotonic() < deadline, "the sleeps did not begin"
        time.sleep(0.1)
    fresh = durableruns.start("scripted", {})
    while run(fresh).status != RunStatus.COMPLETED:
        assert time.monotonic() < deadline, f"the new run did not complete: {run(fresh).status}"
        time.sleep(0.1)
    asleep = RunState.objects.filter(pk__in=sleeping)
    assert asleep.filter(status=RunStatus.WAITING, lease_expires_at__isnull=True).count() == 50
    assert not RunStep.objects.filter(run_id__in=sleeping, step="woke").exists()
    assert worker.poll() is None


def test_show_run_says_what_the_run_waits_for_and_lists_its_events():
    from io import StringIO

    from django.core.management import call_command

    run_id = durableruns.start("waits_continue", {})
    resume()
    durableruns.send(run_id, "stray", {"x": 1}, key="k-1")
    out = StringIO()
    call_command("show_run", run_id, stdout=out)
    text = out.getvalue()
    assert "waiting for signal since" in text and "(times out" in text
    assert "stray" in text and "key=k-1" in text and "kept: no wait has consumed it" in text
    assert "signal               waiting" in text  # the boundary's zone of the begun wait
