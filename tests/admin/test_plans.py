"""The admin and plans: the runs list by plan (with how many unfinished runs each plan still has: what a deploy
must keep until they drain), and moving runs to the current plan, behind its own permission."""

from __future__ import annotations

import pytest
from django.test import Client

from durableruns import store
from durableruns.models import Intervention, RunState, RunStatus
from durableruns.plans import Plan, fingerprint_of
from tests.admin.users import logged_in, staff
from tests.factories import complete, make_run
from tests.workflows import scripted

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"
OLD_STEPS = (("first", "re_executable"), ("second", "resolvable"))
OLD = Plan(fingerprint=fingerprint_of(OLD_STEPS), workflow="scripted", steps=OLD_STEPS)


def under_old_plan(run_id: str, *done: str) -> str:
    make_run("scripted", run_id=run_id)
    store.record_plan(OLD)
    RunState.objects.filter(pk=run_id).update(plan_fingerprint=OLD.fingerprint)
    for step in done:
        complete(run_id, step, {})
    return run_id


def listed(response) -> list[str]:
    return [run.run_id for run in response.context["cl"].result_list]


def test_the_runs_list_filters_by_plan_and_counts_the_unfinished_runs_of_each(as_viewer: Client):
    under_old_plan("old-1", "first")
    under_old_plan("old-2")
    make_run("scripted", run_id="new-1")
    make_run("scripted", run_id="ghost")
    RunState.objects.filter(pk="ghost").update(plan_fingerprint="0123456789abcdef")
    make_run("scripted", run_id="new-done")
    RunState.objects.filter(pk="new-done").update(status=RunStatus.COMPLETED)

    page = as_viewer.get(RUNS)
    [plans] = [f for f in page.context["cl"].filter_specs if getattr(f, "parameter_name", "") == "plan"]
    labels = dict(plans.lookup_choices)
    assert labels[OLD.fingerprint] == f"scripted {OLD.fingerprint} (2 unfinished)"
    assert labels[scripted.fingerprint] == f"scripted {scripted.fingerprint} (1 unfinished)"  # new-done is done
    assert labels["unrecorded"] == "not recorded"
    assert sorted(listed(as_viewer.get(RUNS, {"plan": OLD.fingerprint}))) == ["old-1", "old-2"]
    assert listed(as_viewer.get(RUNS, {"plan": "unrecorded"})) == ["ghost"]
    assert "the rest unknown: the run&#x27;s plan is not recorded" in as_viewer.get(
        RUNS, {"plan": "unrecorded"}).content.decode()


def test_moving_runs_to_the_current_plan_needs_its_permission_and_moves_only_those_that_fit(as_operator: Client):
    under_old_plan("fits", "first")
    under_old_plan("misfit", "first", "second")
    RunState.objects.filter(pk="misfit").update(plan_fingerprint=fingerprint_of(
        (("first", "re_executable"), ("second", "escalate"))))
    store.record_plan(Plan(fingerprint=fingerprint_of((("first", "re_executable"), ("second", "escalate"))),
                           workflow="scripted", steps=(("first", "re_executable"), ("second", "escalate"))))
    assert "adopt_plan_runs" not in dict(as_operator.get(RUNS).context["action_form"].fields["action"].choices)
    as_operator.post(RUNS, {"action": "adopt_plan_runs", "_selected_action": "fits", "post": "yes", "note": "n"})
    assert RunState.objects.get(pk="fits").plan_fingerprint == OLD.fingerprint and not Intervention.objects.exists()

    planner = staff("pat", "view_runstate", "adopt_plan")
    client = logged_in(planner)
    confirm = client.post(RUNS, {"action": "adopt_plan_runs", "_selected_action": ["fits", "misfit"]})
    assert "Move these runs to this deploy&#x27;s plan of their workflow?" in confirm.content.decode()
    done = client.post(RUNS, {"action": "adopt_plan_runs", "_selected_action": ["fits", "misfit"], "post": "yes",
                              "note": "third is needed now"}, follow=True)
    said = " ".join(str(m) for m in done.context["messages"])
    assert "Moved to the current plan 1 run(s): fits." in said, said
    assert "misfit was not moved to the current plan: run misfit cannot adopt plan" in said
    assert "second was attempted as escalate, and the new plan declares it resolvable" in said
    assert RunState.objects.get(pk="fits").plan_fingerprint == scripted.fingerprint
    act = Intervention.objects.get()
    assert (act.run_id, act.action, act.user, act.note) == ("fits", "adopt_plan", planner, "third is needed now")
    assert act.result["from_plan"] == OLD.fingerprint and act.result["to_plan"] == scripted.fingerprint
