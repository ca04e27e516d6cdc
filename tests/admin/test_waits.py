"""Runs that wait, in the admin: the approval queue beside the escalation queue (the run's input, results so far
and the approval's doc, escaped), deciding there behind durableruns.decide_approval, the runs list's "waiting for"
filter, and the run page's waiting step and events."""

from __future__ import annotations

import pytest
from django.urls import reverse

import durableruns
from durableruns import services
from durableruns.models import Intervention, RunState, RunStatus
from tests.admin.users import VIEW, logged_in, staff

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "/admin/durableruns/runstate/approvals/"
EVIL = "<script>alert(1)</script>"


def big_order(run_id: str = "po-big") -> str:
    durableruns.start("waiting", {"total": 25_000, "note": EVIL}, run_id=run_id)
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.WAITING
    return run_id


def test_the_queue_shows_each_approval_with_the_runs_input_results_and_doc_escaped(as_viewer):
    run_id = big_order()
    assert reverse("admin:durableruns_approvals") == QUEUE
    page = as_viewer.get(QUEUE)
    html = page.content.decode()
    assert page.status_code == 200
    assert "manager_approval" in html and run_id in html and "Check the quote against the budget." in html
    assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&quot;total&quot;: 25000" in html  # the quote's result so far
    assert 'name="outcome" value="approve"' not in html  # a viewer reads, and is told what deciding needs
    assert as_viewer.post(QUEUE, {"run_id": run_id, "step": "manager_approval", "outcome": "approve",
                                  "note": "yes"}).status_code == 403
    assert not Intervention.objects.exists()
    escalations = as_viewer.get("/admin/durableruns/escalation/").content.decode()
    assert QUEUE in escalations


def test_an_approver_decides_once_and_the_act_is_recorded_with_who_and_why(far):
    run_id = big_order()
    approver = logged_in(staff("ann", *VIEW, "decide_approval"))
    assert 'value="approve"' in approver.get(QUEUE).content.decode()
    body = {"run_id": run_id, "step": "manager_approval", "outcome": "reject", "note": "over budget"}
    response = approver.post(QUEUE, body, follow=True)
    assert response.status_code == 200
    (act,) = Intervention.objects.filter(run_id=run_id)
    assert (act.action, act.decided_by, act.note, act.attempt) == ("reject", "ann", "over budget", 1)
    again = approver.post(QUEUE, dict(body, outcome="approve"), follow=True).content.decode()
    assert "Nothing was recorded" in again and "already decided by ann" in again
    assert Intervention.objects.filter(run_id=run_id).count() == 1
    assert "No run waits for an approval." in approver.get(QUEUE).content.decode()
    services.resume_due()
    cancelled = RunState.objects.get(pk=run_id)
    assert cancelled.status == RunStatus.CANCELLED and "ann" in cancelled.reason


def test_the_runs_list_filters_by_what_runs_wait_for_and_the_run_page_shows_the_wait_and_its_events(as_viewer):
    run_id = big_order()
    other = durableruns.start("sleeper", {"seconds": 600}, run_id="nap-1")
    services.resume_due()
    durableruns.send(run_id, "supplier_confirmed", {"ref": EVIL}, key="k")
    listed = as_viewer.get("/admin/durableruns/runstate/", {"waiting_for": "manager_approval"}).content.decode()
    assert run_id in listed and other not in listed
    assert "nap (sleep)" in listed  # the filter offers every wait step by name and kind
    page = as_viewer.get(reverse("admin:durableruns_runstate_change", args=[run_id])).content.decode()
    assert "waiting for approval manager_approval" in page and 'id="dr-events"' in page
    assert EVIL not in page and "&lt;script&gt;" in page and "no wait has consumed it" in page
