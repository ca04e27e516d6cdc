"""The engine's rules, worked in-process against the real database (transactional: commits are real)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import durableruns
from durableruns import services, store
from durableruns.clock import Clock
from durableruns.errors import (
    AlreadyDecided,
    DuplicateRun,
    EffectInTransaction,
    EscalationNotFound,
    FencedOut,
    InvalidDecision,
    InvalidInput,
    RunNotActionable,
    UnknownWorkflow,
)
from durableruns.models import Escalation, Intervention, Resolution, RunState, RunStatus, RunStep, StepStatus
from durableruns.passes import ensure_autocommit
from durableruns.store import Intent
from tests.factories import complete, crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def later(seconds: float) -> Clock:
    """The database's clock, `seconds` ahead: every statement and comparison of the pass moves together."""
    return Clock(shift=timedelta(seconds=seconds))


def attempts(run_id: str, step: str) -> list[tuple[int, str]]:
    return list(RunStep.objects.filter(run_id=run_id, step=step).order_by("attempt").values_list("attempt", "status"))


def status(run_id: str) -> str:
    return RunState.objects.get(pk=run_id).status


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


# -- starting ---------------------------------------------------------------------------------------------


def test_start_records_a_pending_run_and_refuses_bad_input():
    run_id = durableruns.start("scripted", {"a": 1}, run_id="po-1")
    run = RunState.objects.get(pk="po-1")
    assert run_id == "po-1" and run.status == RunStatus.PENDING and run.input == {"a": 1}
    with pytest.raises(DuplicateRun):
        durableruns.start("scripted", {}, run_id="po-1")
    with pytest.raises(UnknownWorkflow):
        durableruns.start("no_such_flow", {})
    with pytest.raises(InvalidInput, match="JSON object"):
        durableruns.start("scripted", [1, 2])
    with pytest.raises(InvalidInput, match="not JSON"):
        durableruns.start("scripted", {"when": object()})
    assert RunState.objects.count() == 1


# -- the happy path and the commits ------------------------------------------------------------------------


def test_a_run_completes_every_step_once_with_stable_keys(far):
    run_id = make_run("order")
    report = services.resume_due()
    assert report.counts() == {"completed": 1} and report.steps_run == 4
    rows = RunStep.objects.filter(run_id=run_id)
    assert sorted(rows.values_list("step", "attempt", "status")) == sorted(
        (s, 1, "completed") for s in ("prepare", "charge", "ship", "notify"))
    assert {r.step: r.effect_key for r in rows}["charge"] == f"{run_id}:charge"
    assert far.payments.count() == 1 and far.carrier.count() == 1
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.cursor, run.owner != "") == (RunStatus.COMPLETED, 4, True)
    b = durableruns.boundary(run_id)
    assert b.done == ["prepare", "charge", "ship", "notify"] and b.remainder == [] and b.status == "completed"


def test_the_boundary_is_public_and_says_the_sentence():
    run_id = make_run()
    complete(run_id, "first", {"ok": 1})
    crash_after_intent(run_id, "second", cursor=1)
    b = durableruns.boundary(run_id)
    assert (b.done, b.in_doubt, b.remainder, b.status) == (["first"], ["second"], ["second", "third"], "running")
    assert str(b).startswith("1 step complete, second in doubt since ") and str(b).endswith("2 steps remaining")


def test_a_step_that_opts_out_of_its_intent_writes_only_its_result():
    wf = durableruns.Workflow("no_intent")
    seen = []

    @wf.step(policy="re_executable", intent=False)
    def pure(ctx):
        seen.append(RunStep.objects.filter(run_id=ctx.run_id).count())
        return {"x": 1}

    run_id = make_run("no_intent")
    services.resume_due()
    assert seen == [0]  # no started row while it ran
    assert attempts(run_id, "pure") == [(1, "completed")]


# -- failures: observed, retried, exhausted -----------------------------------------------------------------


def test_a_rejection_is_failed_retried_then_fails_the_run():
    run_id = make_run(input={"first": "reject"})
    services.resume_due()
    assert attempts(run_id, "first") == [(1, "failed"), (2, "failed"), (3, "failed")]
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED and "gave up" not in run.reason and "3 of 3" in run.reason
    assert "refused" in RunStep.objects.get(run_id=run_id, step="first", attempt=3).error


def test_a_rejection_once_then_success(settings):
    run_id = make_run(input={"first": "reject_once"})
    services.resume_due()
    assert attempts(run_id, "first") == [(1, "failed"), (2, "completed")]


def test_backoff_releases_the_run_until_its_wake_time(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 30
    run_id = make_run(input={"first": "reject_once"})
    services.resume_due()
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.WAITING and run.wake_at is not None
    assert services.resume_due().outcomes == []  # not due yet
    services.resume_due(clock=later(31))
    assert attempts(run_id, "first") == [(1, "failed"), (2, "completed")]


def test_a_resolvable_step_that_raises_is_in_doubt_not_failed():
    run_id = make_run(input={"second": "boom"})
    services.resume_due()
    assert attempts(run_id, "second") == [(1, "started")]
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.WAITING and "lag" in run.reason


def test_a_result_that_is_not_json_is_never_recorded_completed():
    run_id = make_run(input={"first": "not_json"})
    services.resume_due()
    rows = RunStep.objects.filter(run_id=run_id, step="first")
    assert set(rows.values_list("status", flat=True)) == {"failed"}
    assert "not JSON" in rows.first().error
    run_id = make_run(input={"second": "not_json"})
    services.resume_due()
    assert attempts(run_id, "second") == [(1, "started")]  # the effect may exist: in doubt, not completed


def test_staff_retry_gives_a_failed_run_new_attempts():
    run_id = make_run(input={"first": "reject"})
    services.resume_due()
    assert status(run_id) == RunStatus.FAILED
    with pytest.raises(InvalidDecision, match="note"):
        services.retry_run(run_id, by="ops", note=" ")
    services.retry_run(run_id, by="ops", note="vendor fixed")
    assert status(run_id) == RunStatus.PENDING
    services.resume_due()
    assert len(attempts(run_id, "first")) == 6  # three more, not one: the count restarted
    retry = Intervention.objects.get(run_id=run_id)
    assert (retry.action, retry.decided_by, retry.step, retry.attempt) == ("retry", "ops", "first", 3)
    with pytest.raises(RunNotActionable):
        services.retry_run(make_run(), by="ops", note="x")


# -- in doubt, by policy ------------------------------------------------------------------------------------


def test_in_doubt_re_executable_runs_again_from_its_checkpoint(far):
    run_id = make_run("order")
    crash_after_intent(run_id, "prepare", loop_cursor=40, progress={"priced": list(range(40))})
    services.resume_due()
    assert attempts(run_id, "prepare")[:2] == [(1, "started"), (2, "completed")]
    assert far.email.count() == 20 + 1  # lines 40..59 redone, not 0..59; then the notify email
    assert RunStep.objects.get(run_id=run_id, step="prepare", attempt=2).result["total"] == sum(range(60))


def test_in_doubt_resolvable_found_by_key_is_completed_without_a_second_effect(far):
    run_id = make_run("order")
    complete(run_id, "prepare", {"total": 10, "lines": 60})
    crash_after_intent(run_id, "charge", cursor=1)
    first = far.payments.charge(amount=110, currency="EUR", idempotency_key=f"{run_id}:charge")
    services.resume_due()
    row = RunStep.objects.get(run_id=run_id, step="charge")
    assert (row.attempt, row.status, row.resolution) == (1, StepStatus.COMPLETED, Resolution.LOOKUP)
    assert row.result == first and far.payments.count() == 1
    assert status(run_id) == RunStatus.COMPLETED


def test_in_doubt_resolvable_not_found_waits_out_the_lag_then_runs_again(far):
    run_id = make_run(input={"lookup": None})
    complete(run_id, "first", {})
    crash_after_intent(run_id, "second", cursor=1)
    services.resume_due()
    run = RunState.objects.get(pk=run_id)
    started = RunStep.objects.get(run_id=run_id, step="second").started_at
    assert run.status == RunStatus.WAITING
    assert run.wake_at == started + timedelta(seconds=30 + 60)  # timeout + lookup_lag
    assert services.resume_due(clock=later(60)).outcomes == []  # absence not provable yet: nobody takes it
    assert attempts(run_id, "second") == [(1, "started")]
    services.resume_due(clock=later(91))
    assert attempts(run_id, "second") == [(1, "started"), (2, "completed")]
    second = RunStep.objects.get(run_id=run_id, step="second", attempt=2)
    assert second.effect_key == f"{run_id}:second"  # the same key as the attempt in doubt


def test_a_lookup_that_raises_is_asked_again_later(settings):
    settings.DURABLERUNS_LOOKUP_RETRY_SECONDS = 5
    run_id = make_run(input={"lookup": "raise"})
    complete(run_id, "first", {})
    crash_after_intent(run_id, "second", cursor=1)
    services.resume_due(clock=later(3600))  # long past the lag: still no absence from a failed lookup
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.WAITING and "lookup raised" in run.reason
    assert attempts(run_id, "second") == [(1, "started")]


def test_in_doubt_escalate_stops_for_a_person_and_nothing_after_runs():
    run_id = make_run()
    complete(run_id, "first", {})
    complete(run_id, "second", {})
    crash_after_intent(run_id, "third", cursor=2)
    report = services.resume_due()
    assert report.counts() == {"needs_decision": 1}
    escalation = Escalation.objects.open().get()
    assert (escalation.run_id, escalation.step, escalation.attempt) == (run_id, "third", 1)
    assert services.resume_due().outcomes == []  # needs_decision is not claimable
    assert attempts(run_id, "third") == [(1, "started")]


@pytest.mark.parametrize(
    ("outcome", "final", "third"),
    [
        ("happened", RunStatus.COMPLETED, [(1, "completed")]),
        ("did_not_happen", RunStatus.COMPLETED, [(1, "started"), (2, "completed")]),
        ("abandon", RunStatus.CANCELLED, [(1, "started")]),
    ],
)
def test_each_decision_applies_once_and_the_next_pass_acts_on_it(outcome, final, third):
    run_id = make_run()
    complete(run_id, "first", {})
    complete(run_id, "second", {})
    crash_after_intent(run_id, "third", cursor=2)
    services.resume_due()
    result = {"message_id": "m-1"} if outcome == "happened" else None
    decision = durableruns.decide(run_id, "third", outcome, by="alice", note="checked the outbox", result=result)
    assert (decision.decided_by, decision.note, decision.action) == ("alice", "checked the outbox", outcome)
    assert decision.decided_at is not None
    with pytest.raises(AlreadyDecided, match="already decided by alice"):
        durableruns.decide(run_id, "third", "abandon", by="bob", note="me too")
    services.resume_due()
    assert status(run_id) == final
    assert attempts(run_id, "third") == third
    if outcome == "happened":
        row = RunStep.objects.get(run_id=run_id, step="third")
        assert row.result == result and row.resolution == Resolution.DECISION


def test_bad_decisions_are_refused_and_change_nothing():
    run_id = make_run()
    with pytest.raises(EscalationNotFound):
        durableruns.decide(run_id, "third", "happened", by="a", note="n")
    complete(run_id, "first", {})
    complete(run_id, "second", {})
    crash_after_intent(run_id, "third", cursor=2)
    services.resume_due()
    with pytest.raises(InvalidDecision, match="outcome"):
        durableruns.decide(run_id, "third", "maybe", by="a", note="n")
    with pytest.raises(InvalidDecision, match="note"):
        durableruns.decide(run_id, "third", "happened", by="a", note="")
    with pytest.raises(InvalidDecision, match="only with 'happened'"):
        durableruns.decide(run_id, "third", "abandon", by="a", note="n", result={"x": 1})
    with pytest.raises(durableruns.errors.ResultNotJSON):
        durableruns.decide(run_id, "third", "happened", by="a", note="n", result={"x": object()})
    assert Intervention.objects.count() == 0 and status(run_id) == RunStatus.NEEDS_DECISION


# -- plans and transactions ---------------------------------------------------------------------------------


def test_a_run_whose_plan_is_not_recorded_waits_for_a_deploy_that_has_it_then_stops_for_staff(settings):
    settings.DURABLERUNS_MISSING_STEP_GRACE_SECONDS = 600
    run_id = make_run()
    complete(run_id, "first", {})
    RunState.objects.filter(pk=run_id).update(plan_fingerprint="0123456789abcdef")
    services.resume_due()
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.WAITING and "not recorded, and not this deploy's" in run.reason, run.reason
    assert run.wake_at is not None and "lacking since" in run.reason
    assert RunStep.objects.filter(run_id=run_id).count() == 1  # nothing run, nothing counted

    # Still within the grace period (measured from when it was first found lacking): it waits again.
    services.resume_due(clock=later(120))
    assert status(run_id) == RunStatus.WAITING
    services.resume_due(clock=later(601))
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.NEEDS_DECISION and "for more than 10 min" in run.reason, run.reason
    assert RunStep.objects.filter(run_id=run_id).count() == 1


def test_no_effect_inside_a_transaction():
    with transaction.atomic():
        with pytest.raises(EffectInTransaction):
            ensure_autocommit()


# -- fencing ------------------------------------------------------------------------------------------------


def test_a_stale_epoch_writes_nothing():
    run_id = make_run()
    old = store.claim(owner="a", lease_seconds=1).lease
    store.record_intent(old, Intent(step="first", attempt=1, effect_key="k", cursor=0))
    new = store.claim(owner="b", lease_seconds=30, clock=later(2))
    assert new is not None and new.lease.epoch == old.epoch + 1
    with pytest.raises(FencedOut):
        store.record_result(old, step="first", attempt=1, result={}, cursor=1)
    with pytest.raises(FencedOut):
        store.checkpoint(old, step="first", attempt=1, loop_cursor=5, progress={})
    with pytest.raises(FencedOut):
        store.record_intent(old, Intent(step="second", attempt=1, effect_key="k2", cursor=1))
    with pytest.raises(FencedOut):
        store.renew(old)
    with pytest.raises(FencedOut):
        store.release(old, status=RunStatus.COMPLETED)
    assert attempts(run_id, "first") == [(1, "started")] and attempts(run_id, "second") == []
    run = RunState.objects.get(pk=run_id)
    assert (run.owner, run.cursor, run.status) == ("b", 0, RunStatus.RUNNING)


def test_the_claim_takes_the_run_due_first_and_never_one_that_is_not_due():
    """A woken run is due since its wake time, any other due run since it was recorded (issue 30: one order on
    PostgreSQL and SQLite, RunStateQuerySet.in_claim_order)."""
    now = timezone.now()
    ids = [make_run(run_id=f"r{i}") for i in range(6)]
    for age, run_id in enumerate(reversed(ids)):  # r0 oldest ... r5 newest
        RunState.objects.filter(pk=run_id).update(created_at=now - timedelta(minutes=age + 1))
    RunState.objects.filter(pk="r0").update(status=RunStatus.RUNNING, lease_expires_at=now + timedelta(seconds=30))
    RunState.objects.filter(pk="r1").update(status=RunStatus.WAITING, wake_at=now + timedelta(seconds=30))
    RunState.objects.filter(pk="r2").update(status=RunStatus.NEEDS_DECISION)
    RunState.objects.filter(pk="r3").update(status=RunStatus.WAITING, wake_at=now - timedelta(seconds=1))
    RunState.objects.filter(pk="r4").update(status=RunStatus.RUNNING, lease_expires_at=now - timedelta(seconds=1))
    taken = [store.claim(owner="w", lease_seconds=30) for _ in range(4)]
    # r4 (its lease ran out) recorded 2 minutes ago, r5 recorded 1 minute ago, r3 woken 1 second ago
    assert [c.lease.run_id if c else None for c in taken] == ["r4", "r5", "r3", None]


def test_a_live_lease_is_not_taken_and_cancel_fences_the_holder():
    run_id = make_run()
    held = store.claim(owner="a", lease_seconds=30).lease
    assert store.claim(owner="b", lease_seconds=30) is None
    assert store.claim(owner="b", lease_seconds=30, run_id=run_id) is None
    services.cancel_run(run_id, by="ops", note="customer withdrew")
    with pytest.raises(FencedOut):
        store.record_intent(held, Intent(step="first", attempt=1, effect_key="k", cursor=0))
    assert status(run_id) == RunStatus.CANCELLED
    assert Intervention.objects.get(run_id=run_id).action == "cancel"


def test_the_heartbeat_keeps_the_lease_of_a_long_step():
    wf = durableruns.Workflow("long_step")
    stolen = []

    @wf.step(policy="re_executable")
    def slow(ctx):
        time.sleep(1.2)  # three times the lease
        stolen.append(store.claim(owner="thief", lease_seconds=30, run_id=ctx.run_id))
        return {}

    run_id = make_run("long_step")
    report = services.resume_due(lease_seconds=0.4)
    assert stolen == [None]  # the lease was still live: renewed while the step ran
    assert report.counts() == {"completed": 1}
    assert attempts(run_id, "slow") == [(1, "completed")]


def test_a_result_for_an_attempt_no_longer_started_writes_nothing_at_all():
    run_id = make_run()
    lease = store.claim(owner="a", lease_seconds=30).lease
    store.record_intent(lease, Intent(step="first", attempt=1, effect_key="k", cursor=0))
    store.record_result(lease, step="first", attempt=1, result={"n": 1}, cursor=1)
    # Replaying the same result with the next intent riding on it: the attempt is completed already.
    with pytest.raises(FencedOut):
        store.record_result(lease, step="first", attempt=1, result={"n": 2}, cursor=1,
                            next_intent=Intent(step="second", attempt=1, effect_key="k2", cursor=1))
    assert attempts(run_id, "second") == []  # the intent in the same statement was not written either
    assert RunStep.objects.get(run_id=run_id, step="first").result == {"n": 1}


@pytest.mark.parametrize("bad", ["nul\x00byte", "lone \ud800 surrogate"])
def test_text_jsonb_cannot_store_is_refused_before_the_database(bad):
    with pytest.raises(InvalidInput):
        durableruns.start("scripted", {"note": bad})
    assert RunState.objects.count() == 0


def test_cancelling_a_run_closes_its_open_escalation():
    run_id = make_run()
    complete(run_id, "first", {})
    complete(run_id, "second", {})
    crash_after_intent(run_id, "third", cursor=2)
    services.resume_due()
    services.cancel_run(run_id, by="ops", note="buyer withdrew the order")
    assert not Escalation.objects.open().exists()
    closed = Escalation.objects.decided().get()
    assert (closed.decision.action, closed.decision.decided_by) == ("cancel", "ops")
    with pytest.raises(AlreadyDecided, match="already decided by ops"):
        durableruns.decide(run_id, "third", "happened", by="alice", note="too late")


def test_what_put_a_step_in_doubt_is_told_to_the_person_who_decides():
    run_id = make_run(input={"third": "boom"})
    services.resume_due()
    escalation = Escalation.objects.open().get()
    assert "ConnectionError: third: connection reset" in escalation.reason
    assert "ConnectionError" in RunState.objects.get(pk=run_id).reason
    assert attempts(run_id, "third") == [(1, "started")]  # still in doubt, not failed


def test_a_run_whose_workflow_left_the_deploy_reads_through_its_own_plan():
    run_id = make_run()
    complete(run_id, "first", {})
    RunState.objects.filter(pk=run_id).update(workflow="gone")
    b = durableruns.boundary(run_id)
    assert b.plan_known and b.plan == ("first", "second", "third") and str(b) == "1 step complete, 2 steps remaining"
    RunState.objects.filter(pk=run_id).update(plan_fingerprint="0123456789abcdef")  # a plan never recorded
    b = durableruns.boundary(run_id)
    assert not b.plan_known and str(b) == "1 step complete, the rest unknown: the run's plan is not recorded"


def test_a_run_started_inside_the_callers_transaction_lives_and_dies_with_it():
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            durableruns.start("scripted", {}, run_id="tx-1")
            raise RuntimeError("the caller's own write failed")
    assert not RunState.objects.filter(pk="tx-1").exists()
    with transaction.atomic():
        durableruns.start("scripted", {}, run_id="tx-2")
        with pytest.raises(DuplicateRun):
            durableruns.start("scripted", {}, run_id="tx-2")
    assert RunState.objects.filter(pk="tx-2").exists()  # the duplicate did not spoil the caller's transaction


@pytest.mark.parametrize("policy", ["re_executable", "resolvable"])
def test_a_step_that_raises_mid_loop_is_retried_from_its_last_checkpoint(policy):
    wf = durableruns.Workflow(f"loop_raises_{policy}")
    seen: list[int] = []

    @wf.step(policy=policy, lookup=(lambda ctx: None) if policy == "resolvable" else None,
             timeout=timedelta(0), lookup_lag=timedelta(0))
    def walk(ctx):
        done = ctx.progress.setdefault("done", [])
        for item in ctx.loop(list(range(60)), every=10):
            seen.append(item)
            done.append(item)
            if item == 34 and ctx.attempt == 1:
                raise ConnectionError("reset mid-loop")
        return {"count": len(done)}

    run_id = make_run(wf.name)
    services.resume_due()
    assert seen == list(range(35)) + list(range(30, 60))  # redid 30..34, at most `every` items
    row = RunStep.objects.get(run_id=run_id, step="walk", attempt=2)
    assert row.status == "completed" and row.result == {"count": 60}
