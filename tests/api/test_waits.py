"""Events and approvals through the API: POST /api/runs/{run_id}/events/ (a partner's webhook relay, by token)
and POST /api/runs/{run_id}/decide/, each behind its own permission; the run's detail shows what it waits for."""

from __future__ import annotations

import pytest

import durableruns
from durableruns import services
from durableruns.models import Intervention, RunEvent, RunState, RunStatus
from tests.api.conftest import READ, escalated_run, user_with

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_for_confirmation() -> str:
    run_id = durableruns.start("waits_continue", {}, run_id="po/7:wait")
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.WAITING
    return run_id


def url(run_id: str, act: str) -> str:
    return f"/api/runs/{run_id}/{act}/"


@pytest.fixture
def relay():
    """A partner's webhook relay: may send events, nothing else (beside reading runs)."""
    return user_with("relay", *READ, "send_event")


@pytest.fixture
def approver():
    return user_with("approver", *READ, "decide_approval")


def test_an_event_by_token_is_recorded_once_per_key_and_completes_the_wait(client_for, relay):
    run_id = waiting_for_confirmation()
    client = client_for(relay)
    body = {"event": "go", "payload": {"ref": "S-1"}, "key": "hook-1"}
    first = client.post(url(run_id, "events"), body, format="json")
    assert first.status_code == 201, first.content
    assert first.json() == {"run_id": run_id, "event": "go", "recorded": True}
    again = client.post(url(run_id, "events"), dict(body, payload={"ref": "other"}), format="json")
    assert again.status_code == 200 and again.json()["recorded"] is False
    detail = client.get(f"/api/runs/{run_id}/").json()
    assert [w["step"] for w in detail["boundary"]["waiting"]] == ["signal"]
    assert detail["boundary"]["waiting"][0]["event"] == "go" and "waiting for signal" in detail["sentence"]
    assert [(e["event"], e["payload"], e["consumed_step"]) for e in detail["events"]] == [("go", {"ref": "S-1"}, "")]
    listed = client.get("/api/runs/", {"waiting_for": "signal"}).json()["results"]
    assert [r["run_id"] for r in listed] == [run_id]
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert client.get(f"/api/runs/{run_id}/").json()["events"][0]["consumed_step"] == "signal"
    assert client.get("/api/runs/", {"waiting_for": "signal"}).json()["results"] == []
    ended = client.post(url(run_id, "events"), {"event": "go"}, format="json")
    assert ended.status_code == 409 and ended.json()["code"] == "run_not_actionable"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"event": ""},
        {"event": "go", "payload": [1]},
        {"event": "go", "payload": "x"},
        {"event": "go", "payload": {"a": "\u0000"}},
        {"event": "x" * 201},
    ],
)
def test_a_bad_event_body_is_a_400_and_records_nothing(client_for, relay, body):
    run_id = waiting_for_confirmation()
    response = client_for(relay).post(url(run_id, "events"), body, format="json")
    assert response.status_code == 400, response.content
    assert not RunEvent.objects.exists()


def test_events_need_a_known_run_and_the_send_event_permission(client_for, relay, reader, anonymous):
    assert client_for(relay).post(url("nope", "events"), {"event": "go"}, format="json").status_code == 404
    run_id = waiting_for_confirmation()
    assert anonymous.post(url(run_id, "events"), {"event": "go"}, format="json").status_code == 401
    assert client_for(reader).post(url(run_id, "events"), {"event": "go"}, format="json").status_code == 403
    assert not RunEvent.objects.exists()


def test_an_approval_through_the_api_needs_its_permission_and_is_decided_once(client_for, approver, reader, far):
    run_id = durableruns.start("waiting", {"total": 50_000})
    services.resume_due()
    body = {"step": "manager_approval", "outcome": "approve", "note": "within budget"}
    assert client_for(reader).post(url(run_id, "decide"), body, format="json").status_code == 403
    wrong = client_for(approver).post(url(run_id, "decide"), dict(body, step="quote"), format="json")
    assert wrong.status_code == 404 and wrong.json()["code"] == "approval_not_found"
    decided = client_for(approver).post(url(run_id, "decide"), body, format="json")
    assert decided.status_code == 200, decided.content
    (act,) = Intervention.objects.filter(run_id=run_id)
    assert (act.action, act.decided_by, act.note) == ("approve", "approver", "within budget")
    twice = client_for(approver).post(url(run_id, "decide"), dict(body, outcome="reject"), format="json")
    assert twice.status_code == 409 and twice.json()["code"] == "already_decided"
    bad = client_for(approver).post(url(run_id, "decide"), dict(body, outcome="maybe"), format="json")
    assert bad.status_code == 400


def test_a_get_of_a_path_ending_in_events_reads_the_run_of_that_id(client_for, reader):
    durableruns.start("waits_continue", {}, run_id="odd/events")
    response = client_for(reader).get("/api/runs/odd/events/")
    assert response.status_code == 200 and response.json()["run_id"] == "odd/events"


def test_an_approver_cannot_approve_a_step_that_is_not_an_approval(client_for, approver):
    """An escalated step's attempt is started like an approval's: approving it would record an approval that never
    existed and move the needs_decision run on. It is a 404, and nothing is recorded."""
    escalation = escalated_run(run_id="po-escalated")
    before = RunState.objects.get(pk=escalation.run_id)
    assert before.status == RunStatus.NEEDS_DECISION
    body = {"step": escalation.step, "outcome": "approve", "note": "looks fine"}
    response = client_for(approver).post(url(escalation.run_id, "decide"), body, format="json")
    assert response.status_code == 404 and response.json()["code"] == "approval_not_found", response.content
    after = RunState.objects.get(pk=escalation.run_id)
    assert (after.status, after.reason) == (before.status, before.reason)
    assert not Intervention.objects.filter(run_id=escalation.run_id).exists()
    with pytest.raises(durableruns.errors.ApprovalNotFound):
        durableruns.decide(escalation.run_id, escalation.step, "reject", by=approver, note="no")
    assert not Intervention.objects.filter(run_id=escalation.run_id).exists()


def test_an_event_for_a_run_being_cancelled_is_refused_409(client_for, relay, far):
    run_id = durableruns.start("napping_holder", {"nap": 3600}, run_id="holder-ending")
    services.resume_due()  # it holds a reservation, then naps
    services.cancel_run(run_id, by="ops", note="withdrawn")
    assert RunState.objects.get(pk=run_id).ending == RunStatus.CANCELLED  # a worker gives it back first
    refused = client_for(relay).post(url(run_id, "events"), {"event": "go"}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "run_not_actionable"  # before: 201, never read
    assert not RunEvent.objects.filter(run_id=run_id).exists()
