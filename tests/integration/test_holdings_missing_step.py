"""A run stopped for a step its deploy lacks gives back what it holds first; if a deploy with the step comes back,
the run goes on and acquires again what it gave back, under keys of its own, rather than carry on with holds it
no longer has. A run cancelled while its deploy lacks a later step is released all the same.

The run here started under a plan of the `holding` workflow (tests/workflows.py) with one more step, `gone`,
between the acquisitions and `pay`; a deploy that came before this one made its two acquisitions at the warehouse
(its own ledger) and recorded them.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from durableruns import services, store
from durableruns.holdings import HoldState
from durableruns.models import RunState, RunStatus, RunStep
from durableruns.plans import STOPPED_MARK, WAITING_MARK, Plan, fingerprint_of
from project.purchasing.far import FarSystems
from tests.factories import complete, make_run
from tests.workflows import holding

pytestmark = pytest.mark.django_db(transaction=True)

OLD_STEPS = (("lock", "re_executable"), ("reserve", "resolvable"), ("gone", "re_executable"),
             ("pay", "re_executable"), ("confirm", "escalate"))
OLD = Plan(fingerprint=fingerprint_of(OLD_STEPS), workflow="holding", steps=OLD_STEPS)


def acquired_under_old_plan(far: FarSystems, run_id: str) -> str:
    """The run as the deploy that had `gone` left it: both acquisitions made at the warehouse and recorded."""
    make_run("holding", run_id=run_id)
    store.record_plan(OLD)
    RunState.objects.filter(pk=run_id).update(plan_fingerprint=OLD.fingerprint)
    complete(run_id, "lock", far.warehouse.reserve(1, key=f"{run_id}:lock"))
    complete(run_id, "reserve", far.warehouse.reserve(3, key=f"{run_id}:reserve"))
    return run_id


def holdings(run_id: str) -> dict[str, HoldState]:
    return {h.step: h.state for h in services.run_holdings(run_id)}


def keys(rows: list[dict[str, Any]], run_id: str) -> list[str]:
    return [r["key"] for r in rows if r["key"].startswith(f"{run_id}:")]


def gone(ctx: Any) -> dict[str, bool]:
    return {"back": True}


@pytest.fixture
def deploy_with_gone():
    """Make this deploy declare `gone` (the deploy that has the step comes back), and forget it afterwards."""
    restored = holding.steps.copy()

    def declare() -> None:
        holding.step(policy="re_executable")(gone)

    yield declare
    holding.steps[:] = restored
    holding._by_name.pop("gone", None)
    holding.__dict__.pop("_plan", None)


def test_a_run_stopped_for_a_missing_step_gives_back_what_it_holds_then_reacquires_when_it_goes_on(
    far: FarSystems, settings, deploy_with_gone
) -> None:
    settings.DURABLERUNS_MISSING_STEP_GRACE_SECONDS = 0
    run_id = acquired_under_old_plan(far, "po-stopped")
    assert holdings(run_id) == {"lock": HoldState.HELD, "reserve": HoldState.HELD}

    services.resume_due()  # this deploy lacks `gone`; no grace: stopped for staff, holds given back first
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.NEEDS_DECISION, "") and run.reason.startswith(STOPPED_MARK)
    assert "gone of the run's plan" in run.reason
    assert keys(far.warehouse.releases(), run_id) == [f"{run_id}:reserve:release", f"{run_id}:lock:release"]
    assert far.warehouse.held() == []
    assert holdings(run_id) == {"lock": HoldState.RELEASED, "reserve": HoldState.RELEASED}
    assert not RunStep.objects.filter(run_id=run_id, step="gone").exists()  # no step of the plan was run

    services.resume_due()  # nothing is given back twice, and the stopped run stays stopped
    assert len(far.warehouse.releases()) == 2
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION

    deploy_with_gone()  # the deploy that has `gone` comes back: its next pass reopens the run
    services.resume_due()
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.reason
    # Acquired again, each under a key of its own: the warehouse did not hand back the reservation given back.
    steps = RunStep.objects.filter(run_id=run_id).order_by("finished_at").values_list("step", "attempt", "effect_key")
    assert list(steps) == [
        ("lock", 1, f"{run_id}:lock"), ("reserve", 1, f"{run_id}:reserve"),
        ("reserve:release", 1, f"{run_id}:reserve:release"), ("lock:release", 1, f"{run_id}:lock:release"),
        ("lock", 2, f"{run_id}:lock#2"), ("reserve", 2, f"{run_id}:reserve#2"),
        ("gone", 1, f"{run_id}:gone"), ("pay", 1, f"{run_id}:pay"), ("confirm", 1, f"{run_id}:confirm"),
    ]
    assert sorted(keys(far.warehouse.held(), run_id)) == [f"{run_id}:lock#2", f"{run_id}:reserve#2"]
    reserve = RunStep.objects.get(run_id=run_id, step="reserve", attempt=2).result
    assert reserve["reservation_id"] in {r["reservation_id"] for r in far.warehouse.held()}
    assert holdings(run_id) == {"lock": HoldState.KEPT, "reserve": HoldState.KEPT}  # the completed run keeps them


def test_a_run_given_back_and_reacquired_releases_the_new_holds_under_their_own_keys(
    far: FarSystems, settings, deploy_with_gone
) -> None:
    settings.DURABLERUNS_MISSING_STEP_GRACE_SECONDS = 0
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0
    run_id = acquired_under_old_plan(far, "po-twice")
    services.resume_due()  # stopped, both given back
    deploy_with_gone()
    RunState.objects.filter(pk=run_id).update(input={"pay": "reject"})  # pay is refused once the run goes on
    services.resume_due()  # reopened, acquired again, pay refused twice: the run fails, releasing the new holds
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED, run.reason
    assert keys(far.warehouse.releases(), run_id) == [
        f"{run_id}:reserve:release", f"{run_id}:lock:release",
        f"{run_id}:reserve:release#2", f"{run_id}:lock:release#2",
    ]
    assert far.warehouse.held() == []  # nothing leaked: the second holds were not taken for the first
    assert holdings(run_id) == {"lock": HoldState.RELEASED, "reserve": HoldState.RELEASED}


def test_a_run_cancelled_while_its_deploy_lacks_a_later_step_is_released_all_the_same(far: FarSystems) -> None:
    run_id = acquired_under_old_plan(far, "po-cancelled")
    services.resume_due()  # within the grace period: left waiting for a deploy that has `gone`, holding on
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.WAITING and run.reason.startswith(WAITING_MARK)
    assert far.warehouse.releases() == []
    services.cancel_run(run_id, by="alice", note="the buyer withdrew")
    assert RunState.objects.get(pk=run_id).ending == RunStatus.CANCELLED
    services.resume_due()  # the releases need only the acquisitions' own steps, which this deploy has
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.CANCELLED, "")
    assert keys(far.warehouse.releases(), run_id) == [f"{run_id}:reserve:release", f"{run_id}:lock:release"]
    assert far.warehouse.held() == []


def test_a_failed_run_retried_by_staff_acquires_again_what_it_gave_back(far: FarSystems, settings) -> None:
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0
    run_id = make_run("holding", {"pay": "reject"}, run_id="po-retried")
    services.resume_due()  # lock and reserve acquired, pay refused twice: failed, both given back
    assert RunState.objects.get(pk=run_id).status == RunStatus.FAILED and far.warehouse.held() == []
    RunState.objects.filter(pk=run_id).update(input={})  # the payment provider's refusal is cleared up
    services.retry_run(run_id, by="alice", note="the card limit was raised")
    services.resume_due()
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.reason
    # The retried run did not pay against stock it had given back: it reserved again first, under new keys.
    assert sorted(keys(far.warehouse.held(), run_id)) == [f"{run_id}:lock#2", f"{run_id}:reserve#2"]
    assert holdings(run_id) == {"lock": HoldState.KEPT, "reserve": HoldState.KEPT}
    pay = RunStep.objects.filter(run_id=run_id, step="pay").order_by("attempt").values_list("attempt", "status")
    assert list(pay) == [(1, "failed"), (2, "failed"), (3, "completed")]


def test_a_worker_lost_while_giving_back_before_the_stop_resumes_the_releasing_from_the_record(
    far: FarSystems, settings
) -> None:
    settings.DURABLERUNS_MISSING_STEP_GRACE_SECONDS = 0
    run_id = acquired_under_old_plan(far, "po-lost")
    # What a worker killed between the two releases leaves: the run ending (needs_decision), its lease run out,
    # the reservation given back and recorded, the lock not yet.
    release = far.warehouse.release(RunStep.objects.get(run_id=run_id, step="reserve").result["reservation_id"],
                                    key=f"{run_id}:reserve:release")
    complete(run_id, "reserve:release", release)
    RunState.objects.filter(pk=run_id).update(status=RunStatus.RUNNING, ending=RunStatus.NEEDS_DECISION,
                                              owner="dead-worker", epoch=1, lease_expires_at=timezone.now())
    services.resume_due()
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.NEEDS_DECISION, "") and run.reason.startswith(STOPPED_MARK)
    assert keys(far.warehouse.releases(), run_id) == [f"{run_id}:reserve:release", f"{run_id}:lock:release"]
    assert far.warehouse.held() == []


def test_a_stop_whose_releasing_is_finished_by_a_deploy_with_the_step_goes_on_at_once(
    far: FarSystems, settings, deploy_with_gone
) -> None:
    run_id = acquired_under_old_plan(far, "po-back")
    RunState.objects.filter(pk=run_id).update(status=RunStatus.RUNNING, ending=RunStatus.NEEDS_DECISION,
                                              owner="dead-worker", epoch=1, lease_expires_at=timezone.now())
    deploy_with_gone()  # the worker that takes the run over has `gone`: it gives back, then the run goes on
    services.resume_due()
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.reason
    assert keys(far.warehouse.releases(), run_id) == [f"{run_id}:reserve:release", f"{run_id}:lock:release"]
    assert sorted(keys(far.warehouse.held(), run_id)) == [f"{run_id}:lock#2", f"{run_id}:reserve#2"]
