"""adopt_plan through the API: behind its own permission, recorded like the other staff acts, refused with
plan_mismatch (naming the step) where the run's record does not fit the current plan."""

from __future__ import annotations

import pytest

from durableruns import store
from durableruns.models import Intervention, RunState, RunStatus
from durableruns.plans import Plan, fingerprint_of
from tests.api.conftest import user_with
from tests.factories import complete, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def under_old_plan(run_id: str, steps: tuple[tuple[str, str], ...], done: tuple[str, ...]) -> str:
    """A scripted run started under an earlier deploy's plan `steps`, which did `done`."""
    make_run("scripted", run_id=run_id)
    old = Plan(fingerprint=fingerprint_of(steps), workflow="scripted", steps=steps)
    store.record_plan(old)
    RunState.objects.filter(pk=run_id).update(plan_fingerprint=old.fingerprint)
    for step in done:
        complete(run_id, step, {})
    return old.fingerprint


def test_adopt_plan_needs_its_permission_and_records_from_which_plan_to_which(client_for, reader):
    old = under_old_plan("po-a", (("first", "re_executable"), ("second", "resolvable")), done=("first",))
    refused = client_for(reader).post("/api/runs/po-a/adopt_plan/", {"note": "n"}, format="json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "Moving a run to the current plan needs the permission durableruns.adopt_plan."
    assert RunState.objects.get(pk="po-a").plan_fingerprint == old and not Intervention.objects.exists()

    planner = user_with("planner", "view_runstate", "adopt_plan")
    response = client_for(planner).post("/api/runs/po-a/adopt_plan/", {"note": "third is needed"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "pending"
    assert [s["step"] for s in response.json()["boundary"]["plan"]] == ["first", "second", "third"]
    act = Intervention.objects.get(run_id="po-a")
    assert (act.action, act.decided_by, act.note) == ("adopt_plan", "planner", "third is needed")
    current = RunState.objects.get(pk="po-a").plan_fingerprint
    assert act.result["from_plan"] == old and act.result["to_plan"] == current != old
    again = client_for(planner).post("/api/runs/po-a/adopt_plan/", {"note": "again"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "run_not_actionable"


def test_a_record_that_does_not_fit_is_refused_with_the_step_and_the_run_untouched(client_for):
    old = under_old_plan("po-m", (("first", "re_executable"), ("second", "escalate")), done=("first", "second"))
    before = RunState.objects.filter(pk="po-m").values().get()
    planner = user_with("planner", "view_runstate", "adopt_plan")
    response = client_for(planner).post("/api/runs/po-m/adopt_plan/", {"note": "try"}, format="json")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "plan_mismatch" and body["step"] == "second" and body["run_id"] == "po-m"
    assert "second was attempted as escalate, and the new plan declares it resolvable" in body["detail"]
    assert RunState.objects.filter(pk="po-m").values().get() == before
    assert RunState.objects.get(pk="po-m").plan_fingerprint == old and not Intervention.objects.exists()
    assert RunState.objects.get(pk="po-m").status == RunStatus.PENDING
