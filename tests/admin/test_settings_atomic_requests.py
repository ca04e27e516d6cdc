"""A site with ATOMIC_REQUESTS = True: the admin's staff actions still work.

Django would run each view inside one transaction; durableruns records each fact in its own durable
transaction (atomic(durable=True) refuses to nest), so a decision, a cancel or a retry inside the request's
transaction was a 500. The views that call a service opt out of the request transaction.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from durableruns import services
from durableruns.models import Intervention, RunState, RunStatus
from tests.admin.records import escalated, failed

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "/admin/durableruns/escalation/"
RUNS = "/admin/durableruns/runstate/"


@pytest.fixture(autouse=True)
def atomic_requests() -> Iterator[None]:
    """ATOMIC_REQUESTS on the default database, read by Django at each request from the connection's settings."""
    before = connection.settings_dict["ATOMIC_REQUESTS"]
    connection.settings_dict["ATOMIC_REQUESTS"] = True
    yield
    connection.settings_dict["ATOMIC_REQUESTS"] = before


def status(run_id: str) -> str:
    return RunState.objects.get(pk=run_id).status


def test_a_decision_is_recorded_and_acted_on(as_operator: Client, operator: User):
    escalation = escalated("run-a")
    page = f"{QUEUE}{escalation.pk}/change/"
    assert as_operator.get(page).status_code == 200
    response = as_operator.post(page, {"outcome": "happened", "note": "found it in the outbox",
                                       "result": '{"message_id": "msg_41"}'})
    assert response.status_code == 302 and response["Location"] == QUEUE
    decision = Intervention.objects.get(escalation=escalation)
    assert (decision.action, decision.user, decision.result) == ("happened", operator, {"message_id": "msg_41"})
    services.resume_due()
    assert status("run-a") == RunStatus.COMPLETED


def test_a_run_is_cancelled_from_its_page(as_operator: Client):
    escalation = escalated("run-b")
    assert as_operator.get(f"{RUNS}run-b/change/").status_code == 200
    response = as_operator.post(RUNS, {"action": "cancel_runs", "_selected_action": ["run-b"], "post": "yes",
                                       "note": "customer withdrew"}, follow=True)
    assert response.status_code == 200
    assert "Cancelled 1 run(s): run-b." in " ".join(str(m) for m in response.context["messages"])
    assert status("run-b") == RunStatus.CANCELLED
    assert Intervention.objects.get(escalation=escalation).action == "cancel"


def test_a_failed_run_is_retried(as_operator: Client):
    run_id = failed("run-c")
    response = as_operator.post(RUNS, {"action": "retry_runs", "_selected_action": [run_id], "post": "yes",
                                       "note": "the supplier fixed their side"}, follow=True)
    assert response.status_code == 200
    assert status(run_id) == RunStatus.PENDING
    assert Intervention.objects.get(run_id=run_id).action == "retry"


def test_the_pages_that_only_read_work_too(as_operator: Client):
    escalated("run-d")
    assert as_operator.get(QUEUE).status_code == 200 and as_operator.get(RUNS).status_code == 200
    assert as_operator.get(f"{RUNS}run-d/change/").context["sentence"]


def test_bulk_acts_are_recorded_under_atomic_requests(as_operator: Client):
    from durableruns.bulk_models import Bulk

    run_id = failed()
    escalation = escalated()
    retried = as_operator.post(RUNS, {"action": "retry_runs", "_selected_action": [run_id], "select_across": "1",
                                      "post": "yes", "note": "carrier is back"})
    assert retried.status_code == 302
    decided = as_operator.post(QUEUE, {"action": "decide_in_bulk", "_selected_action": [escalation.pk],
                                       "post": "yes", "outcome": "abandon", "note": "nobody will check"})
    assert decided.status_code == 302
    # "select all": every run listed, the escalated one too (the workers skip it: it waits for a decision)
    assert sorted(Bulk.objects.values_list("action", "total")) == [("decide", 1), ("retry", 2)]
