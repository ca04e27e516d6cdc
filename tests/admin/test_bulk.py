"""The back office's bulk acts: "select all N" on the runs list makes cancel, retry and restart-from-the-failed-step
a bulk the workers act on (nothing in the request), confirmed with a note; then the bulk's progress page. The
escalation queue's bulk decision: one outcome and note for the selected escalations, decided by the workers."""

from __future__ import annotations

import pytest
from django.test import Client

from durableruns import services
from durableruns.bulk_models import Bulk, BulkItem
from durableruns.models import Escalation, Intervention, RunState, RunStatus
from tests.admin.records import escalated, failed
from tests.admin.users import OPERATE, VIEW, logged_in, staff
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"
QUEUE = "/admin/durableruns/escalation/"


def select_all(client: Client, action: str, query: str = "", **more: str):
    """Tick the page, then "select all N": the action's POST as Django's changelist sends it."""
    ticked = list(RunState.objects.values_list("pk", flat=True)[:1])
    return client.post(f"{RUNS}{query}", {"action": action, "_selected_action": ticked, "select_across": "1",
                                          "index": "0", **more})


def test_select_all_then_cancel_records_a_bulk_of_every_matching_run_and_acts_on_none_in_the_request(
        as_operator: Client):
    ids = [failed(f"f-{i}") for i in range(3)]
    pending = make_run("scripted", run_id="still-pending")
    confirm = select_all(as_operator, "cancel_runs", "?status__exact=failed")
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "<strong>3</strong> matching the list's filters (status = failed)" in page
    assert not Bulk.objects.exists()
    no_note = select_all(as_operator, "cancel_runs", "?status__exact=failed", post="yes", note=" ")
    assert no_note.status_code == 200 and not Bulk.objects.exists()
    done = as_operator.post(f"{RUNS}?status__exact=failed", {
        "action": "cancel_runs", "_selected_action": ids[:1], "select_across": "1", "post": "yes",
        "note": "outage, given up"})
    bulk = Bulk.objects.get()
    assert done.status_code == 302 and done["Location"] == f"{RUNS}bulk/{bulk.bulk_id}/"
    assert (bulk.action, bulk.filter, bulk.total, bulk.decided_by) == ("cancel", {"status": "failed"}, 3, "alice")
    assert sorted(BulkItem.objects.values_list("run_id", flat=True)) == sorted(ids)
    assert not Intervention.objects.filter(action="cancel").exists()  # nothing acted on in the request
    progress = as_operator.get(done["Location"]).content.decode()
    assert '<span class="dr-bulk-state">running</span>' in progress and 'http-equiv="refresh"' in progress
    services.resume_due()
    progress = as_operator.get(done["Location"]).content.decode()
    assert '<span class="dr-bulk-state">finished</span>' in progress and 'http-equiv="refresh"' not in progress
    assert '<span class="dr-bulk-done">3</span> of <span class="dr-bulk-total">3</span>' in progress
    assert set(RunState.objects.filter(pk__in=ids).values_list("status", flat=True)) == {RunStatus.CANCELLED}
    assert RunState.objects.get(pk=pending).status != RunStatus.CANCELLED


def test_restart_from_the_failed_step_is_a_bulk_and_its_page_lists_the_skipped(settings):
    restarter = staff("rita", *VIEW, "restart_run")
    client = logged_in(restarter)
    ids = [failed(f"f-{i}") for i in range(2)]
    done = make_run("scripted", run_id="done")
    services.resume_due(run_id=done)
    response = select_all(client, "restart_failed_runs", post="yes", note="carrier fixed")
    bulk = Bulk.objects.get()
    assert response.status_code == 302 and (bulk.action, bulk.from_step, bulk.total) == ("restart", "", 3)
    services.resume_due(run_id="nothing")  # a pass for one run leaves bulks alone
    assert not RunState.objects.filter(restarted_from__isnull=False).exists()
    from durableruns import bulks

    bulks.drain()
    assert sorted(RunState.objects.filter(restarted_from__isnull=False).values_list("restarted_from", flat=True)) \
        == sorted(ids)
    page = client.get(response["Location"]).content.decode()
    assert "Skipped (1)" in page and "this run has no failed step to restart from; it is completed" in page
    assert f"{RUNS}done/change/" in page


def test_the_bulk_actions_need_their_permissions():
    viewer = logged_in(staff("viola", *VIEW))
    make_run("scripted")
    assert viewer.get(RUNS).context["action_form"] is None  # no action offered at all
    for action in ("cancel_runs", "retry_runs", "restart_failed_runs"):
        select_all(viewer, action, post="yes", note="n")
    assert not Bulk.objects.exists()
    canceller = logged_in(staff("carl", *VIEW, "cancel_run"))
    choices = [c[0] for c in canceller.get(RUNS).context["action_form"].fields["action"].choices]
    assert "cancel_runs" in choices and "restart_failed_runs" not in choices and "retry_runs" not in choices
    select_all(canceller, "restart_failed_runs", post="yes", note="n")
    select_all(canceller, "retry_runs", post="yes", note="n")
    assert not Bulk.objects.exists()


def test_ticked_runs_without_select_all_are_still_cancelled_in_the_request(as_operator: Client):
    run_id = make_run("scripted")
    as_operator.post(RUNS, {"action": "cancel_runs", "_selected_action": [run_id], "post": "yes", "note": "n"})
    assert RunState.objects.get(pk=run_id).status == RunStatus.CANCELLED and not Bulk.objects.exists()


def test_a_bulk_decision_decides_each_selected_escalation_once_outside_the_request(as_operator: Client):
    chosen = [escalated(f"e-{i}").pk for i in range(2)]
    left = escalated("e-left").pk
    confirm = as_operator.post(QUEUE, {"action": "decide_in_bulk", "_selected_action": chosen, "index": "0"})
    assert confirm.status_code == 200 and "<strong>2</strong> selected" in confirm.content.decode()
    done = as_operator.post(QUEUE, {"action": "decide_in_bulk", "_selected_action": chosen, "post": "yes",
                                    "outcome": "did_not_happen", "note": "checked the outbox: nothing sent"})
    bulk = Bulk.objects.get()
    assert done.status_code == 302 and (bulk.action, bulk.outcome, bulk.total) == ("decide", "did_not_happen", 2)
    assert not Intervention.objects.exists()  # decided by the workers, not this request
    services.resume_due(run_id="nothing")
    from durableruns import bulks

    bulks.drain()
    assert sorted(Intervention.objects.filter(bulk_id=bulk.bulk_id).values_list("escalation_id", "decided_by")) == [
        (pk, "alice") for pk in sorted(chosen)]
    assert Escalation.objects.get(pk=left).is_open
    assert "finished" in as_operator.get(done["Location"]).content.decode()


def test_a_bulk_decision_needs_the_decide_permission():
    viewer = logged_in(staff("viola", *VIEW))
    chosen = [escalated("e-1").pk]
    viewer.post(QUEUE, {"action": "decide_in_bulk", "_selected_action": chosen, "post": "yes",
                        "outcome": "abandon", "note": "n"})
    assert not Bulk.objects.exists()


def test_the_progress_page_needs_to_see_runs_and_says_nothing_of_a_bulk_that_is_not_there():
    operator = staff("alice", *OPERATE)
    make_run("scripted", run_id="r")
    outsider = logged_in(staff("otto"))
    from durableruns import bulks

    bulk_id, _ = bulks.start_bulk("cancel", {"workflow": "scripted"}, by=operator, note="n")
    assert outsider.get(f"{RUNS}bulk/{bulk_id}/").status_code == 403
    assert logged_in(operator).get(f"{RUNS}bulk/bulk-nope/").status_code == 403
