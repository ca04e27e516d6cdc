"""durableruns.restart, worked in-process against the real database with the suite's far systems: a restarted
run keeps its source's effect keys, looks a resolvable step up by that key before calling it, and never calls
what it copied."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F

import durableruns
from durableruns import services
from durableruns.clock import Clock
from durableruns.errors import InvalidDecision, InvalidInput, RunNotActionable, RunNotFound
from durableruns.models import Intervention, Resolution, RunState, RunStatus, RunStep, StepStatus
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def later(seconds: float) -> Clock:
    return Clock(shift=timedelta(seconds=seconds))


def rows(run_id: str) -> dict[str, list[RunStep]]:
    found: dict[str, list[RunStep]] = {}
    for row in RunStep.objects.filter(run_id=run_id).order_by("step", "attempt"):
        found.setdefault(row.step, []).append(row)
    return found


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


@pytest.fixture
def completed(far) -> str:
    run_id = make_run("order")
    assert services.resume_due().counts() == {"completed": 1}
    assert far.payments.count() == 1 and far.carrier.count() == 1
    return run_id


def test_a_restart_from_charge_finds_the_charge_and_the_shipment_by_key_and_calls_neither(far, completed):
    lines = far.email.count()
    new = durableruns.restart(completed, "charge", by="ops", note="fix deployed")
    run = RunState.objects.get(pk=new)
    assert new != completed and run.status == RunStatus.PENDING and run.workflow == "order"
    assert (run.restarted_from, run.restarted_step, run.key_run_id) == (completed, "charge", completed)
    assert run.input == RunState.objects.get(pk=completed).input

    report = services.resume_due(run_id=new)
    assert report.counts() == {"completed": 1}
    steps = rows(new)
    # prepare: copied, with the source's result, never called (its loop would have mailed 60 lines)
    assert [(r.status, r.resolution) for r in steps["prepare"]] == [("completed", Resolution.COPIED)]
    assert steps["prepare"][0].result == rows(completed)["prepare"][0].result
    # charge and ship: looked up by the source's keys, found, no second call
    for step in ("charge", "ship"):
        assert [(r.status, r.resolution, r.effect_key) for r in steps[step]] == [
            ("completed", Resolution.LOOKUP, f"{completed}:{step}")]
    assert far.payments.count() == 1 and far.carrier.count() == 1
    assert far.payments.duplicates() == {} and far.carrier.duplicates() == {}
    assert steps["charge"][0].result["charge_id"] == rows(completed)["charge"][0].result["charge_id"]
    # notify (escalate: no lookup) runs again, under the source's key
    assert steps["notify"][0].effect_key == f"{completed}:notify"
    assert far.email.count() == lines + 1


def test_a_restart_of_a_restart_keeps_the_originals_keys(far, completed):
    first = durableruns.restart(completed, "ship", by="ops", note="again")
    services.resume_due(run_id=first)
    second = durableruns.restart(first, "ship", by="ops", note="and again")
    assert RunState.objects.get(pk=second).key_run_id == completed
    services.resume_due(run_id=second)
    assert rows(second)["ship"][0].effect_key == f"{completed}:ship"
    assert rows(second)["charge"][0].effect_key == f"{completed}:charge"
    assert far.carrier.count() == 1 and far.payments.count() == 1


def test_a_step_the_source_never_reached_is_called_under_the_sources_key(far):
    run_id = make_run("order")
    services.cancel_run(run_id, by="ops", note="stop before it starts")
    new = durableruns.restart(run_id, "prepare", by="ops", note="go after all")
    assert services.resume_due(run_id=new).counts() == {"completed": 1}
    steps = rows(new)
    # prepare's intent rode on the claim (PostgreSQL): the claim names it after the source too
    assert [r.effect_key for r in steps["prepare"]] == [f"{run_id}:prepare"]
    assert [r.effect_key for r in steps["charge"]] == [f"{run_id}:charge"]
    assert steps["charge"][0].resolution == Resolution.RETURNED
    assert far.payments.effects(f"{run_id}:charge") and far.payments.count() == 1


def test_an_absent_effect_is_called_only_after_the_lookups_lag(far, completed):
    # The source's charge left in doubt with nothing at the payment provider under its key: the lookup finds
    # nothing, and the restart calls it only once absence is provable (the source's bound plus timeout and lag).
    key = f"{completed}:charge"
    RunStep.objects.filter(run_id=completed, step="charge").update(
        status=StepStatus.STARTED, result=None, resolution="", raised_at=F("started_at"))
    far.payments.reset()
    new = durableruns.restart(completed, "charge", by="ops", note="charge never landed")
    marker = rows(new)["charge"]
    assert [(m.attempt, m.status, m.effect_key) for m in marker] == [(1, "started", key)]
    # Before the source's call could have landed (the clock a minute back): not found is not absence yet.
    early = services.resume_due(run_id=new, clock=later(-60))
    assert early.counts() == {"waiting": 1} and far.payments.count() == 0
    assert "not found yet" in RunState.objects.get(pk=new).reason
    # Long after the source's call: absent is proven at once, so the charge is made, once, under the same key.
    assert services.resume_due(run_id=new, clock=later(5)).counts() == {"completed": 1}
    charge = rows(new)["charge"]
    assert [(r.attempt, r.status, r.effect_key) for r in charge] == [(1, "started", key), (2, "completed", key)]
    assert far.payments.counts_by_key() == {key: 1}


def test_only_an_ended_run_can_be_restarted(far):
    run_id = make_run("order")
    with pytest.raises(RunNotActionable, match="pending"):
        durableruns.restart(run_id, "charge", by="ops", note="too early")
    with pytest.raises(RunNotFound):
        durableruns.restart("no-such-run", "charge", by="ops", note="x")
    assert RunState.objects.count() == 1 and not Intervention.objects.exists()


def test_bad_steps_and_notes_are_refused_naming_the_step(far):
    run_id = make_run("order")
    services.cancel_run(run_id, by="ops", note="stop")
    with pytest.raises(InvalidInput, match="nope"):
        durableruns.restart(run_id, "nope", by="ops", note="x")
    with pytest.raises(InvalidInput, match="prepare"):  # the source never completed prepare
        durableruns.restart(run_id, "charge", by="ops", note="x")
    with pytest.raises(InvalidDecision, match="note"):
        durableruns.restart(run_id, "prepare", by="ops", note="  ")
    assert RunState.objects.count() == 1
    assert list(Intervention.objects.values_list("action", flat=True)) == ["cancel"]


def test_the_restart_is_a_staff_act_on_both_runs(far, completed):
    new = durableruns.restart(completed, "charge", by="ops", note="fix deployed")
    on_source = Intervention.objects.get(run_id=completed, action=Intervention.Action.RESTART)
    on_new = Intervention.objects.get(run_id=new, action=Intervention.Action.RESTART)
    for act in (on_source, on_new):
        assert (act.decided_by, act.note, act.step) == ("ops", "fix deployed", "charge")
        assert act.decided_at is not None
    assert on_source.result == {"restarted_as": new, "bulk_id": None}
    assert on_new.result == {"restarted_from": completed, "bulk_id": None}


def test_the_bulk_id_is_recorded_on_both_acts(far, completed):
    from durableruns.restarts import restart

    new = restart(completed, "ship", by="ops", note="bulk", bulk_id="b-1")
    assert Intervention.objects.get(run_id=completed, action="restart").result["bulk_id"] == "b-1"
    assert Intervention.objects.get(run_id=new, action="restart").result["bulk_id"] == "b-1"


def test_what_the_source_gave_back_is_acquired_again_under_keys_of_its_own(far):
    # pay is refused on every attempt: the run fails, and gives back both holdings (lock and reserve)
    run_id = make_run("holding", {"pay": "reject"})
    services.resume_due(run_id=run_id)
    source = RunState.objects.get(pk=run_id)
    assert source.status == RunStatus.FAILED, source.reason
    held_before = far.warehouse.count()
    new = durableruns.restart(run_id, "pay", by="ops", note="pay again once the fix is out")
    services.resume_due(run_id=new)
    steps = rows(new)
    # the copied holdings and their releases say so; each is acquired again under round 2's key, not the source's
    assert [(r.attempt, r.resolution) for r in steps["lock"]][0] == (1, Resolution.COPIED)
    assert steps["lock"][-1].effect_key == f"{run_id}:lock#2" and steps["lock"][-1].status == "completed"
    assert steps["reserve"][-1].effect_key == f"{run_id}:reserve#2"
    assert far.warehouse.count() > held_before
    assert far.warehouse.duplicates() == {}


FAST = {"TEST_LOOKUP_LAG": "0.3", "TEST_STEP_TIMEOUT": "0.2", "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0"}


@pytest.mark.postgres
def test_in_real_workers_a_charge_whose_worker_was_killed_is_found_by_the_restart_not_made_again(
        far, workers, tmp_path):
    import signal

    run_id = make_run("order")
    # the worker charges, then is SIGKILLed before it records the result: the charge is in doubt in the source
    crashed = workers.run("--lease", "0.5", **FAST, DURABLERUNS_CRASH_AT="charge@after_effect",
                          DURABLERUNS_CRASH_MARKER=str(tmp_path / "crashed"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    assert far.payments.count() == 1
    services.cancel_run(run_id, by="ops", note="stopped while the provider was checked")
    new = durableruns.restart(run_id, "prepare", by="ops", note="go after all")
    done = workers.run("--lease", "5", **FAST)
    assert done.returncode == 0, done.stderr
    assert RunState.objects.get(pk=new).status == RunStatus.COMPLETED, RunState.objects.get(pk=new).reason
    charge = rows(new)["charge"]
    assert [(r.status, r.resolution, r.effect_key) for r in charge] == [
        ("completed", Resolution.LOOKUP, f"{run_id}:charge")]
    assert far.payments.counts_by_key() == {f"{run_id}:charge": 1}  # one charge per key: no second call
    assert far.carrier.counts_by_key() == {f"{run_id}:ship": 1}  # never reached by the source: called once
