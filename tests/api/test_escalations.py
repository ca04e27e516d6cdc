"""/api/escalations/ and /api/escalations/{id}/decide/: the queue, and decisions that apply exactly once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from durableruns import services
from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from tests.api.conftest import escalated_run, user_with

pytestmark = pytest.mark.django_db(transaction=True)


def counts() -> tuple[int, int, int]:
    return RunState.objects.count(), RunStep.objects.count(), Intervention.objects.count()


def decide(client, escalation_id: int, **body):
    return client.post(f"/api/escalations/{escalation_id}/decide/", body, format="json")


# -- the queue ---------------------------------------------------------------------------------------------


def test_the_queue_lists_open_escalations_oldest_first_with_what_a_person_needs(client_for, reader):
    newer = escalated_run(run_id="po-newer")
    older = escalated_run(run_id="po-older")
    Escalation.objects.filter(pk=older.pk).update(opened_at=timezone.now() - timedelta(hours=2))

    response = client_for(reader).get("/api/escalations/")

    assert response.status_code == 200
    results = response.json()["results"]
    assert [e["id"] for e in results] == [older.pk, newer.pk]
    item = results[0]
    assert (item["run_id"], item["workflow"], item["step"], item["attempt"], item["effect_key"]) == (
        "po-older",
        "scripted",
        "third",
        1,
        "po-older:third",
    )
    assert item["doc"] == "Nobody can look this up; decide by hand."
    assert item["sentence"].startswith("2 steps complete, third in doubt since ")
    assert item["in_doubt_since"] and item["opened_at"] and item["decision"] is None


def test_decided_escalations_are_shown_with_their_decision_on_request(client_for, reader, decider):
    open_one = escalated_run(run_id="po-open")
    decided = escalated_run(run_id="po-decided")
    services.resolve_escalation(decided.pk, "abandon", by=decider, note="customer cancelled by phone")
    client = client_for(reader)

    assert [e["id"] for e in client.get("/api/escalations/").json()["results"]] == [open_one.pk]
    assert [e["id"] for e in client.get("/api/escalations/?state=open").json()["results"]] == [open_one.pk]
    [item] = client.get("/api/escalations/?state=decided").json()["results"]
    assert item["id"] == decided.pk
    decision = item["decision"]
    assert (decision["action"], decision["decided_by"], decision["note"], decision["result"]) == (
        "abandon",
        "decider",
        "customer cancelled by phone",
        None,
    )
    assert decision["decided_at"]
    assert {e["id"] for e in client.get("/api/escalations/?state=all").json()["results"]} == {open_one.pk, decided.pk}
    response = client.get("/api/escalations/?state=closed")
    assert response.status_code == 400 and "state" in response.json()


def test_the_docstring_of_an_unknown_workflow_is_empty_not_an_error(client_for, reader):
    escalation = escalated_run(run_id="po-retired")
    RunState.objects.filter(pk="po-retired").update(workflow="retired_flow")
    [item] = client_for(reader).get("/api/escalations/").json()["results"]
    assert item["id"] == escalation.pk and item["doc"] == "" and item["workflow"] == "retired_flow"


# -- deciding ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "result", "final", "third"),
    [
        ("happened", {"message_id": "m-1"}, RunStatus.COMPLETED, [(1, "completed")]),
        ("did_not_happen", None, RunStatus.COMPLETED, [(1, "started"), (2, "completed")]),
        ("abandon", None, RunStatus.CANCELLED, [(1, "started")]),
    ],
)
def test_a_decision_records_who_and_why_and_the_next_pass_acts_on_it(
    client_for, decider, outcome, result, final, third
):
    escalation = escalated_run(run_id="po-9")
    body = {"outcome": outcome, "note": "checked the outbox"}
    if result is not None:
        body["result"] = result

    response = decide(client_for(decider), escalation.pk, **body)

    assert response.status_code == 200, response.content
    decision = response.json()["decision"]
    assert (decision["action"], decision["decided_by"], decision["note"], decision["result"]) == (
        outcome,
        "decider",
        "checked the outbox",
        result,
    )
    intervention = Intervention.objects.get(escalation=escalation)
    assert intervention.user_id == decider.pk and intervention.action == outcome
    expected = RunStatus.CANCELLED if outcome == "abandon" else RunStatus.PENDING  # resumable
    assert RunState.objects.get(pk="po-9").status == expected
    services.resume_due()
    assert RunState.objects.get(pk="po-9").status == final
    assert (
        list(RunStep.objects.filter(run_id="po-9", step="third").order_by("attempt").values_list("attempt", "status"))
        == third
    )
    if outcome == "happened":
        assert RunStep.objects.get(run_id="po-9", step="third").result == result


def test_deciding_twice_is_a_409_naming_who_decided_first(client_for, decider):
    escalation = escalated_run()
    assert decide(client_for(decider), escalation.pk, outcome="did_not_happen", note="not sent").status_code == 200
    second_person = user_with("bob", "decide_escalation")
    before = counts()
    status_before = RunState.objects.get(pk=escalation.run_id).status

    response = decide(client_for(second_person), escalation.pk, outcome="happened", note="I saw it go")

    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "already_decided" and body["decided_by"] == "decider" and body["decided_at"]
    assert body["detail"].startswith("already decided by decider at ")
    assert counts() == before and RunState.objects.get(pk=escalation.run_id).status == status_before
    assert Intervention.objects.get(escalation=escalation).decided_by == "decider"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"outcome": "maybe", "note": "n"}, "not a valid choice"),
        ({"outcome": "happened"}, "This field is required."),
        ({"outcome": "happened", "note": "   "}, "may not be blank"),
        ({"note": "n"}, "This field is required."),
        ({"outcome": "abandon", "note": "n", "result": {"x": 1}}, "only with 'happened'"),
        ({"outcome": "happened", "note": "n", "result": {"x": "\u0000"}}, "NUL"),
    ],
)
def test_a_bad_decision_is_a_400_and_changes_nothing(client_for, decider, body, says):
    escalation = escalated_run()
    before = counts()
    response = decide(client_for(decider), escalation.pk, **body)
    assert response.status_code == 400
    assert says in str(response.json())
    assert counts() == before and Escalation.objects.open().count() == 1
    assert RunState.objects.get(pk=escalation.run_id).status == RunStatus.NEEDS_DECISION


def test_invalid_decision_carries_its_code(client_for, decider):
    escalation = escalated_run()
    response = decide(client_for(decider), escalation.pk, outcome="did_not_happen", note="n", result=[1])
    assert response.status_code == 400 and response.json()["code"] == "invalid_decision"


def test_malformed_json_decision_is_a_400(client_for, decider):
    escalation = escalated_run()
    before = counts()
    response = client_for(decider).post(
        f"/api/escalations/{escalation.pk}/decide/", data="{outcome: happened", content_type="application/json"
    )
    assert response.status_code == 400 and "JSON parse error" in response.json()["detail"]
    assert counts() == before


def test_an_unknown_escalation_is_a_404(client_for, decider):
    response = decide(client_for(decider), 424242, outcome="abandon", note="n")
    assert response.status_code == 404 and response.json()["code"] == "escalation_not_found"
    assert response.json()["escalation_id"] == 424242


def test_a_run_cancelled_meanwhile_is_a_409_and_nothing_is_recorded(client_for, decider):
    escalation = escalated_run()
    services.cancel_run(escalation.run_id, by="ops", note="customer withdrew")
    before = counts()
    response = decide(client_for(decider), escalation.pk, outcome="happened", note="n")
    assert response.status_code == 409 and response.json()["code"] == "already_decided"
    assert "already decided by ops" in response.json()["detail"]  # the cancel closed the escalation
    assert counts() == before and Escalation.objects.open().count() == 0
