"""POST /api/runs/bulk/ and GET /api/runs/bulk/{bulk_id}/: 202 with the bulk's id and total, at once; each act
behind its own permission (403, nothing recorded); bad input a 400 naming the problem; the caller's scope; the
progress's shape, as a pass acts on the runs."""

from __future__ import annotations

import pytest

from durableruns import services
from durableruns.bulk_models import Bulk, BulkItem
from durableruns.models import Intervention, RunState, RunStatus
from tests.api.conftest import READ, user_with
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)

BULK = "/api/runs/bulk/"


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


@pytest.fixture
def canceller():
    return user_with("canceller", *READ, "cancel_run")


@pytest.fixture
def restarter():
    return user_with("restarter", *READ, "restart_run")


def failed(n: int) -> list[str]:
    ids = [make_run("scripted", {"first": "reject"}, run_id=f"f-{i}") for i in range(n)]
    services.resume_due()
    return ids


def test_a_bulk_cancel_answers_202_at_once_and_a_pass_acts_on_each_run(client_for, canceller, far):
    ids = [make_run("scripted", run_id=f"w-{i}") for i in range(3)]
    make_run("order", run_id="other")
    client = client_for(canceller)
    response = client.post(
        BULK, {"action": "cancel", "filter": {"workflow": "scripted"}, "note": "outage"}, format="json"
    )
    assert response.status_code == 202, response.json()
    body = response.json()
    assert set(body) == {"bulk_id", "total"} and body["total"] == 3
    assert response["Location"].endswith(f"{BULK}{body['bulk_id']}/")
    assert not Intervention.objects.exists()  # nothing acted on in the request
    progress = client.get(f"{BULK}{body['bulk_id']}/")
    assert progress.status_code == 200
    assert progress.json() == {"state": "running", "total": 3, "done": 0, "failed": []}
    services.resume_due()
    assert progress.json() != (after := client.get(f"{BULK}{body['bulk_id']}/").json())
    assert after == {"state": "finished", "total": 3, "done": 3, "failed": []}
    assert sorted(Intervention.objects.filter(bulk_id=body["bulk_id"]).values_list("run_id", "decided_by")) == [
        (r, "canceller") for r in ids
    ]
    assert RunState.objects.get(pk="other").status != RunStatus.CANCELLED
    assert not Intervention.objects.filter(run_id="other").exists()


def test_the_bulk_and_the_list_share_one_filter(client_for, superuser):
    ids = failed(2)
    make_run("scripted", run_id="pending-one")
    client = client_for(superuser)
    filters = {"workflow": "scripted", "status": "failed"}
    listed = client.get("/api/runs/", filters).json()["results"]
    response = client.post(BULK, {"action": "retry", "filter": filters, "note": "n"}, format="json")
    assert response.json()["total"] == len(listed) == 2
    bulk_id = response.json()["bulk_id"]
    assert (
        sorted(BulkItem.objects.filter(bulk_id=bulk_id).values_list("run_id", flat=True))
        == sorted(r["run_id"] for r in listed)
        == sorted(ids)
    )


def test_skipped_runs_are_listed_with_their_reason(client_for, superuser):
    ids = failed(2)
    client = client_for(superuser)
    bulk_id = client.post(BULK, {"action": "retry", "filter": {"status": "failed"}, "note": "n"}, format="json").json()[
        "bulk_id"
    ]
    services.cancel_run(ids[0], by="x", note="gone")
    services.resume_due()
    assert client.get(f"{BULK}{bulk_id}/").json() == {
        "state": "finished",
        "total": 2,
        "done": 2,
        "failed": [{"run_id": ids[0], "reason": "it no longer matches the bulk's filter"}],
    }


@pytest.mark.parametrize(
    ("perms", "body"),
    [
        (("retry_run",), {"action": "cancel", "filter": {"workflow": "scripted"}, "note": "n"}),
        (("cancel_run",), {"action": "retry", "filter": {"workflow": "scripted"}, "note": "n"}),
        (
            ("cancel_run", "retry_run"),
            {"action": "restart", "filter": {"workflow": "scripted"}, "note": "n", "from_step": "first"},
        ),
        ((), {"action": "cancel", "filter": {"workflow": "scripted"}, "note": "n"}),
    ],
)
def test_each_act_needs_its_own_permission_and_a_refusal_records_nothing(client_for, perms, body):
    make_run("scripted")
    user = user_with("someone", *READ, *perms)
    response = client_for(user).post(BULK, body, format="json")
    assert response.status_code == 403
    assert "permission" in response.json()["detail"]
    assert not Bulk.objects.exists() and not BulkItem.objects.exists()


def test_reading_a_bulk_needs_view_runstate(client_for, outsider, anonymous, superuser):
    make_run("scripted")
    bulk_id = (
        client_for(superuser)
        .post(BULK, {"action": "cancel", "filter": {"workflow": "scripted"}, "note": "n"}, format="json")
        .json()["bulk_id"]
    )
    assert client_for(outsider).get(f"{BULK}{bulk_id}/").status_code == 403
    assert anonymous.get(f"{BULK}{bulk_id}/").status_code == 401
    assert anonymous.post(BULK, {}, format="json").status_code == 401
    missing = client_for(superuser).get(f"{BULK}bulk-nope/")
    assert missing.status_code == 404 and missing.json()["code"] == "bulk_not_found"


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"action": "delete", "filter": {"workflow": "scripted"}, "note": "n"}, "action", "not a valid choice"),
        ({"action": "cancel", "filter": {"workflow": "scripted"}}, "note", "required"),
        ({"action": "cancel", "filter": {"workflow": "scripted"}, "note": ""}, "note", "blank"),
        ({"action": "cancel", "filter": {"status": "sleeping"}, "note": "n"}, "filter", "sleeping"),
        ({"action": "cancel", "filter": {"attr": ["no-colon"]}, "note": "n"}, "filter", "name:value"),
        ({"action": "cancel", "filter": {"stauts": "failed"}, "note": "n"}, "filter", "unknown filter 'stauts'"),
        ({"action": "cancel", "filter": {}, "note": "n"}, "filter", "at least one filter"),
        ({"action": "cancel", "filter": "status=failed", "note": "n"}, "filter", "object"),
        ({"action": "cancel", "note": "n"}, "filter", "required"),
        ({"action": "restart", "filter": {"workflow": "scripted"}, "note": "n"}, "from_step", "needs from_step"),
        (
            {"action": "cancel", "filter": {"workflow": "scripted"}, "note": "n", "from_step": "first"},
            "from_step",
            "only with restart",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_problem(client_for, superuser, body, field, says):
    make_run("scripted")
    response = client_for(superuser).post(BULK, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json() and says in str(response.json()[field]), response.json()
    assert not Bulk.objects.exists()


def test_a_restart_from_a_step_no_plan_has_is_a_400_naming_it(client_for, restarter):
    make_run("scripted")
    response = client_for(restarter).post(
        BULK, {"action": "restart", "filter": {"workflow": "scripted"}, "note": "n", "from_step": "nope"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input" and "'nope'" in response.json()["detail"]
    assert not Bulk.objects.exists()


def test_malformed_json_and_a_non_object_body_are_400s(client_for, superuser):
    client = client_for(superuser)
    bad = client.post(BULK, "{not json", content_type="application/json")
    assert bad.status_code == 400
    assert client.post(BULK, [1, 2], format="json").status_code == 400
    assert not Bulk.objects.exists()


def test_a_bulk_takes_only_the_runs_in_the_callers_scope(client_for, settings, canceller, far):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"scripted": ["payroll"]}
    make_run("scripted", run_id="payroll-run")
    make_run("order", run_id="order-run")
    response = client_for(canceller).post(
        BULK, {"action": "cancel", "filter": {"status": "pending"}, "note": "n"}, format="json"
    )
    assert response.json()["total"] == 1
    services.resume_due(run_id="none")  # a single pass for one run does not take bulks: nothing acted on yet
    assert not Intervention.objects.exists()
    services.resume_due()
    assert not Intervention.objects.filter(run_id="payroll-run").exists()
    assert RunState.objects.get(pk="order-run").status == RunStatus.CANCELLED
