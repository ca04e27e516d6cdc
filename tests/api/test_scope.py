"""DURABLERUNS_WORKFLOW_GROUPS through the API: a workflow scoped to groups is seen and acted on only by their
members and superusers; for anyone else its runs are in no list, their details and acts are 404, its escalations
are not in the queue, and it cannot be started (refused as a name nobody declared)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

import durableruns
from durableruns import services
from durableruns.models import Intervention, RunState, RunStatus
from tests.api.conftest import READ, escalated_run, user_with

pytestmark = pytest.mark.django_db(transaction=True)

PAYROLL = "Payroll"


@pytest.fixture(autouse=True)
def scoped(settings):
    """`scripted` is the payroll's, seen by its group; `waiting` and the rest are everyone's."""
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"scripted": [PAYROLL]}


@pytest.fixture
def clerk():
    """Every permission a purchasing clerk needs, and not in Payroll."""
    return user_with(
        "clerk", *READ, "start_run", "cancel_run", "retry_run", "decide_escalation", "decide_approval", "send_event"
    )


@pytest.fixture
def payroll_clerk():
    user = user_with("payroll_clerk", *READ, "start_run", "cancel_run", "decide_escalation")
    user.groups.add(Group.objects.create(name=PAYROLL))
    return user


def test_a_scoped_workflows_runs_are_in_no_list_for_someone_outside_its_groups(
    client_for, clerk, payroll_clerk, superuser
):
    payroll = durableruns.start("scripted", {"month": "2026-11"}, run_id="payroll-nov")
    purchase = durableruns.start("waiting", {"total": 10})
    listed = client_for(clerk).get("/api/runs/").json()["results"]
    assert [r["run_id"] for r in listed] == [purchase]
    for query in (f"?run_id={payroll}", "?workflow=scripted", f"?effect_key={payroll}:first", "?status=pending"):
        found = client_for(clerk).get(f"/api/runs/{query}").json()["results"]
        assert payroll not in [r["run_id"] for r in found], query
    for user in (payroll_clerk, superuser):
        seen = {r["run_id"] for r in client_for(user).get("/api/runs/").json()["results"]}
        assert seen == {payroll, purchase}, user


def test_a_scoped_runs_detail_and_every_act_on_it_are_404_and_record_nothing(client_for, clerk, payroll_clerk):
    run_id = durableruns.start("scripted", {}, run_id="payroll-dec")
    client = client_for(clerk)
    detail = client.get(f"/api/runs/{run_id}/")
    assert detail.status_code == 404 and detail.json()["code"] == "run_not_found"
    for act, body in (
        ("cancel", {"note": "n"}),
        ("retry", {"note": "n"}),
        ("events", {"event": "e"}),
        ("decide", {"step": "first", "outcome": "approve", "note": "n"}),
    ):
        response = client.post(f"/api/runs/{run_id}/{act}/", body, format="json")
        assert response.status_code == 404 and response.json()["code"] == "run_not_found", (act, response.content)
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.PENDING and not Intervention.objects.filter(run_id=run_id).exists()
    assert not run.events.exists()
    assert client_for(payroll_clerk).get(f"/api/runs/{run_id}/").status_code == 200
    cancelled = client_for(payroll_clerk).post(f"/api/runs/{run_id}/cancel/", {"note": "wrong month"}, format="json")
    assert cancelled.status_code == 200, cancelled.content


def test_a_scoped_workflow_cannot_be_started_by_someone_outside_its_groups(client_for, clerk, payroll_clerk):
    refused = client_for(clerk).post("/api/runs/", {"workflow": "scripted", "input": {}}, format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "unknown_workflow", refused.content
    known = refused.json()["detail"].split("(known: ")[1]
    assert "waiting" in known and "scripted" not in known  # the names it lists leave the scoped one out
    assert not RunState.objects.filter(workflow="scripted").exists()
    started = client_for(payroll_clerk).post("/api/runs/", {"workflow": "scripted", "input": {}}, format="json")
    assert started.status_code == 201, started.content


def test_a_scoped_runs_escalations_are_out_of_the_queue_and_cannot_be_decided(client_for, clerk, payroll_clerk):
    escalation = escalated_run("payroll-esc")
    queue = client_for(clerk).get("/api/escalations/").json()["results"]
    assert queue == []
    decided = client_for(clerk).post(
        f"/api/escalations/{escalation.pk}/decide/", {"outcome": "happened", "note": "seen in the bank"}, format="json"
    )
    assert decided.status_code == 404 and decided.json()["code"] == "escalation_not_found", decided.content
    assert not Intervention.objects.filter(run_id="payroll-esc").exists()
    assert [e["id"] for e in client_for(payroll_clerk).get("/api/escalations/").json()["results"]] == [escalation.pk]
    ok = client_for(payroll_clerk).post(
        f"/api/escalations/{escalation.pk}/decide/", {"outcome": "happened", "note": "seen in the bank"}, format="json"
    )
    assert ok.status_code == 200, ok.content


def test_with_no_scope_set_everyone_the_permissions_admit_sees_every_run(client_for, clerk, settings):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {}
    run_id = durableruns.start("scripted", {})
    services.resume_due(run_id=run_id)
    assert client_for(clerk).get(f"/api/runs/{run_id}/").status_code == 200
