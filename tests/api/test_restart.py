"""POST /api/runs/{run_id}/restart/: behind durableruns.restart_run, scoped, 201 with the new run's id; 400 for a
bad step or note, 404 for a run unknown or out of scope, 409 for a run that has not ended."""

from __future__ import annotations

import pytest

from durableruns import services
from durableruns.models import Intervention, RunState, RunStatus
from tests.api.conftest import READ, user_with
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def restarter():
    return user_with("restarter", *READ, "restart_run")


@pytest.fixture
def ended(far) -> str:
    run_id = make_run("order", run_id="po-done")
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    return run_id


def test_restart_needs_its_permission_and_changes_nothing_without_it(client_for, reader, ended):
    refused = client_for(reader).post(
        f"/api/runs/{ended}/restart/", {"from_step": "charge", "note": "n"}, format="json"
    )
    assert refused.status_code == 403
    assert refused.json()["detail"] == "Restarting a run needs the permission durableruns.restart_run."
    assert RunState.objects.count() == 1 and not Intervention.objects.exists()


def test_restart_answers_201_with_the_new_run_and_records_the_act_on_both(client_for, restarter, ended):
    response = client_for(restarter).post(
        f"/api/runs/{ended}/restart/", {"from_step": "charge", "note": "fix deployed"}, format="json"
    )
    assert response.status_code == 201
    new = response.json()["run_id"]
    assert set(response.json()) == {"run_id"} and new != ended
    run = RunState.objects.get(pk=new)
    assert (run.restarted_from, run.restarted_step, run.status) == (ended, "charge", RunStatus.PENDING)
    acts = Intervention.objects.filter(action="restart").order_by("run_id")
    assert sorted((a.run_id, a.decided_by, a.note) for a in acts) == sorted(
        [(ended, "restarter", "fix deployed"), (new, "restarter", "fix deployed")]
    )
    # The new run's detail says where it came from
    detail = client_for(restarter).get(f"/api/runs/{new}/").json()
    assert detail["restarted_from"] == ended and detail["restarted_step"] == "charge"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"from_step": "nope", "note": "n"}, "nope"),
        ({"from_step": "charge"}, "note"),
        ({"from_step": "charge", "note": "  "}, "note"),
        ({"note": "n"}, "from_step"),
        ({"from_step": 3, "note": "n"}, "3"),
        ({"from_step": "x" * 201, "note": "n"}, "from_step"),
    ],
)
def test_bad_input_is_a_400_that_says_what(client_for, restarter, ended, body, says):
    response = client_for(restarter).post(f"/api/runs/{ended}/restart/", body, format="json")
    assert response.status_code == 400, response.content
    assert says in response.content.decode()
    assert RunState.objects.count() == 1


def test_an_earlier_step_without_a_result_is_a_400_naming_it(client_for, restarter, far):
    run_id = make_run("order", run_id="po-cancelled")
    services.cancel_run(run_id, by="ops", note="stop")
    response = client_for(restarter).post(
        f"/api/runs/{run_id}/restart/", {"from_step": "ship", "note": "n"}, format="json"
    )
    assert response.status_code == 400 and "prepare" in response.json()["detail"]


def test_a_run_that_has_not_ended_is_409_and_an_unknown_one_404(client_for, restarter, far):
    make_run("order", run_id="po-open")
    busy = client_for(restarter).post("/api/runs/po-open/restart/", {"from_step": "charge", "note": "n"}, format="json")
    assert busy.status_code == 409 and busy.json()["code"] == "run_not_actionable"
    missing = client_for(restarter).post(
        "/api/runs/po-none/restart/", {"from_step": "charge", "note": "n"}, format="json"
    )
    assert missing.status_code == 404 and missing.json()["code"] == "run_not_found"
    assert RunState.objects.count() == 1 and not Intervention.objects.exists()


def test_a_run_out_of_scope_is_404_and_nothing_is_recorded(client_for, restarter, ended, settings):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"order": ["Shipping"]}
    response = client_for(restarter).post(
        f"/api/runs/{ended}/restart/", {"from_step": "charge", "note": "n"}, format="json"
    )
    assert response.status_code == 404 and response.json()["code"] == "run_not_found"
    assert RunState.objects.count() == 1 and not Intervention.objects.exists()
