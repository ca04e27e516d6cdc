"""Cancel and retry through the API, each behind its own permission; and every write endpoint works on a site
with ATOMIC_REQUESTS = True (the views opt out of the request's transaction: the services commit each fact in
a durable transaction of its own, which cannot nest in it)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from durableruns import services
from durableruns.models import Intervention, RunState, RunStatus
from tests.api.conftest import escalated_run
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_backoff(settings: Any) -> None:
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


def failed(run_id: str) -> str:
    """A scripted run whose first step the far system refused on every attempt."""
    make_run("scripted", input={"first": "reject"}, run_id=run_id)
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.FAILED
    return run_id


@pytest.fixture
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """ATOMIC_REQUESTS on the database, as a site sets it: Django reads it per request."""
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)


def test_cancel_needs_its_permission_and_records_who_and_why(client_for, reader, operator):
    make_run(run_id="po-1")
    refused = client_for(reader).post("/api/runs/po-1/cancel/", {"note": "n"}, format="json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "Cancelling a run needs the permission durableruns.cancel_run."
    assert RunState.objects.get(pk="po-1").status == RunStatus.PENDING and not Intervention.objects.exists()

    response = client_for(operator).post("/api/runs/po-1/cancel/", {"note": "duplicate order"}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    act = Intervention.objects.get(run_id="po-1")
    assert (act.action, act.decided_by, act.note) == ("cancel", "operator", "duplicate order")
    again = client_for(operator).post("/api/runs/po-1/cancel/", {"note": "again"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "run_not_actionable"


def test_retry_needs_its_permission_and_gives_the_failed_step_fresh_attempts(client_for, reader, operator):
    failed("po-f")
    refused = client_for(reader).post("/api/runs/po-f/retry/", {"note": "n"}, format="json")
    assert refused.status_code == 403 and RunState.objects.get(pk="po-f").status == RunStatus.FAILED
    response = client_for(operator).post("/api/runs/po-f/retry/", {"note": "vendor fixed"}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "pending"
    assert Intervention.objects.get(run_id="po-f").step == "first"


def test_staff_acts_answer_404_and_400_as_documented(client_for, operator):
    missing = client_for(operator).post("/api/runs/nobody/cancel/", {"note": "n"}, format="json")
    assert missing.status_code == 404 and missing.json()["code"] == "run_not_found"
    make_run(run_id="po-1")
    no_note = client_for(operator).post("/api/runs/po-1/cancel/", {}, format="json")
    assert no_note.status_code == 400 and "note" in no_note.json()
    not_failed = client_for(operator).post("/api/runs/po-1/retry/", {"note": "n"}, format="json")
    assert not_failed.status_code == 409 and not_failed.json()["code"] == "run_not_actionable"


def test_a_run_whose_id_ends_like_an_act_is_still_readable(client_for, reader):
    make_run(run_id="po-1/cancel")
    response = client_for(reader).get("/api/runs/po-1/cancel/")
    assert response.status_code == 200 and response.json()["run_id"] == "po-1/cancel"


def test_every_write_works_under_atomic_requests(atomic_requests, client_for, superuser):
    client = client_for(superuser)
    escalation = escalated_run(run_id="po-e")
    failed("po-f")

    started = client.post("/api/runs/", {"workflow": "scripted", "input": {}, "run_id": "po-new"}, format="json")
    decided = client.post(
        f"/api/escalations/{escalation.pk}/decide/", {"outcome": "happened", "note": "seen"}, format="json"
    )
    retried = client.post("/api/runs/po-f/retry/", {"note": "vendor fixed"}, format="json")
    cancelled = client.post("/api/runs/po-new/cancel/", {"note": "not needed"}, format="json")

    assert [r.status_code for r in (started, decided, retried, cancelled)] == [201, 200, 200, 200]
    assert RunState.objects.get(pk="po-new").status == RunStatus.CANCELLED
    assert RunState.objects.get(pk="po-f").status == RunStatus.PENDING
    assert Intervention.objects.count() == 3
    # the decision took effect: the next pass completes the run
    services.resume_due(run_id="po-e")
    assert RunState.objects.get(pk="po-e").status == RunStatus.COMPLETED


def test_a_refusal_under_atomic_requests_is_still_a_clean_409(atomic_requests, client_for, decider):
    escalation = escalated_run(run_id="po-e")
    client = client_for(decider)
    assert (
        client.post(
            f"/api/escalations/{escalation.pk}/decide/", {"outcome": "abandon", "note": "n"}, format="json"
        ).status_code
        == 200
    )
    second = client.post(
        f"/api/escalations/{escalation.pk}/decide/", {"outcome": "happened", "note": "n"}, format="json"
    )
    assert second.status_code == 409 and second.json()["code"] == "already_decided"


def test_a_staff_act_outlives_the_user_who_did_it(operator):
    """An intervention keeps its user's id, with no constraint (migration 0017): deleting the user (in whatever
    database the site keeps its users) neither fails nor edits the record of who acted."""
    make_run(run_id="po-gone")
    act = services.cancel_run("po-gone", by=operator, note="duplicate order")
    user_id = operator.pk
    operator.delete()
    kept = Intervention.objects.get(pk=act.pk)
    assert (kept.user_id, kept.decided_by, kept.action) == (user_id, "operator", "cancel")
