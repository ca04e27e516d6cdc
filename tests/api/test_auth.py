"""Who may read and who may act: anonymous callers are refused, token and session both work, and the two
writing endpoints need their permission, refusing without changing anything."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from tests.api.conftest import escalated_run
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)

READS = ["/api/runs/", "/api/runs/po-1/", "/api/escalations/", "/api/escalations/?state=all"]


def counts() -> tuple[int, int, int]:
    return RunState.objects.count(), RunStep.objects.count(), Intervention.objects.count()


@pytest.fixture
def seeded() -> Escalation:
    make_run(run_id="po-1")
    return escalated_run(run_id="po-2")


@pytest.mark.parametrize("url", READS)
def test_anonymous_reads_are_refused(anonymous, seeded, url):
    response = anonymous.get(url)
    assert response.status_code in (401, 403)
    assert response.json() == {"detail": "Authentication credentials were not provided."}


def test_anonymous_writes_are_refused_and_change_nothing(anonymous, seeded):
    before = counts()
    started = anonymous.post("/api/runs/", {"workflow": "scripted", "input": {}}, format="json")
    decided = anonymous.post(f"/api/escalations/{seeded.pk}/decide/", {"outcome": "abandon", "note": "n"},
                             format="json")
    assert started.status_code in (401, 403) and decided.status_code in (401, 403)
    assert counts() == before


def test_a_wrong_token_is_refused(seeded):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    response = client.get("/api/runs/")
    assert response.status_code in (401, 403) and response.json()["detail"] == "Invalid token."


@pytest.mark.parametrize("url", READS)
def test_any_signed_in_user_reads_by_token(client_for, reader, seeded, url):
    assert client_for(reader).get(url).status_code == 200


def test_session_authentication_reads(reader, seeded):
    client = APIClient()
    assert client.login(username="reader", password="pw-reader")
    response = client.get("/api/runs/")
    assert response.status_code == 200 and response.json()["count"] == 2


def test_session_writes_need_the_csrf_token(starter):
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="starter", password="pw-starter")
    body = {"workflow": "scripted", "input": {}, "run_id": "by-session"}

    refused = client.post("/api/runs/", body, format="json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    assert not RunState.objects.filter(pk="by-session").exists()

    secret = "a" * 32
    client.cookies["csrftoken"] = secret
    accepted = client.post("/api/runs/", body, format="json", HTTP_X_CSRFTOKEN=secret)
    assert accepted.status_code == 201
    assert RunState.objects.get(pk="by-session").status == RunStatus.PENDING


def test_starting_a_run_needs_the_start_run_permission(client_for, reader, decider, starter):
    body = {"workflow": "scripted", "input": {}, "run_id": "po-new"}
    for user in (reader, decider):
        response = client_for(user).post("/api/runs/", body, format="json")
        assert response.status_code == 403
        assert response.json()["detail"] == "Starting a run needs the permission durableruns.start_run."
        assert RunState.objects.count() == 0
    assert client_for(starter).post("/api/runs/", body, format="json").status_code == 201


def test_a_refused_start_does_not_even_parse_the_body(client_for, reader):
    response = client_for(reader).post("/api/runs/", data="{not json", content_type="application/json")
    assert response.status_code == 403 and RunState.objects.count() == 0


def test_deciding_needs_the_decide_escalation_permission(client_for, reader, starter, decider, seeded):
    before = counts()
    for user in (reader, starter):
        response = client_for(user).post(f"/api/escalations/{seeded.pk}/decide/",
                                         {"outcome": "happened", "note": "n"}, format="json")
        assert response.status_code == 403
        assert response.json()["detail"] == ("Deciding an escalation needs the permission "
                                             "durableruns.decide_escalation.")
    assert counts() == before and Escalation.objects.open().count() == 1
    assert RunState.objects.get(pk="po-2").status == RunStatus.NEEDS_DECISION
    response = client_for(decider).post(f"/api/escalations/{seeded.pk}/decide/",
                                        {"outcome": "happened", "note": "n"}, format="json")
    assert response.status_code == 200 and Escalation.objects.open().count() == 0


def test_a_superuser_may_do_both(client_for, superuser, seeded):
    client = client_for(superuser)
    assert client.post("/api/runs/", {"workflow": "scripted", "input": {}}, format="json").status_code == 201
    assert client.post(f"/api/escalations/{seeded.pk}/decide/", {"outcome": "abandon", "note": "n"},
                       format="json").status_code == 200
