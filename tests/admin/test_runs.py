"""The runs screens through Django's test client: list, filters, search, the run page, read-only, actions."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

import pytest

from durableruns import services
from durableruns.models import Intervention, RunState, RunStatus, RunStep
from tests.admin.users import logged_in, staff
from tests.admin.records import completed, escalated, failed, purchase_in_doubt
from tests.conftest import CITUS_LANE
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"


def run_page(run_id: str) -> str:
    return f"{RUNS}{run_id}/change/"


def listed(response) -> list[str]:
    return [run.run_id for run in response.context["cl"].result_list]


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# -- the list ---------------------------------------------------------------------------------------------


def test_the_runs_list_says_where_each_run_stands_newest_first(as_viewer: Client):
    escalated("run-a")
    failed("run-b")
    completed("run-c")
    response = as_viewer.get(RUNS)
    assert response.status_code == 200
    assert listed(response) == ["run-c", "run-b", "run-a"]
    html = response.content.decode()
    assert "2 steps complete, third in doubt since" in html and "1 step remaining" in html
    assert "0 steps complete, first failed (attempt 3), 3 steps remaining" in html
    assert "all 3 steps complete" in html
    assert '<span class="dr-badge dr-alert">needs decision</span>' in html
    assert "third is in doubt and has no lookup" in html  # the reason, under the sentence


def test_filters_by_status_and_by_workflow(as_viewer: Client):
    escalated("run-a")
    failed("run-b")
    make_run("order", run_id="ord-1")
    assert listed(as_viewer.get(RUNS, {"status__exact": "failed"})) == ["run-b"]
    assert listed(as_viewer.get(RUNS, {"status__exact": "needs_decision"})) == ["run-a"]
    assert listed(as_viewer.get(RUNS, {"workflow": "order"})) == ["ord-1"]
    assert sorted(listed(as_viewer.get(RUNS, {"workflow": "scripted"}))) == ["run-a", "run-b"]


def test_search_finds_a_run_by_its_id_or_by_an_effect_key(as_viewer: Client):
    escalated("po-41")
    escalated("po-42")
    completed("other")
    assert listed(as_viewer.get(RUNS, {"q": "po-4"})) == ["po-42", "po-41"]
    assert listed(as_viewer.get(RUNS, {"q": "po-41"})) == ["po-41"]
    # An effect key is not part of any run id: only the attempt made under it finds the run.
    assert listed(as_viewer.get(RUNS, {"q": "po-41:second"})) == ["po-41"]
    assert listed(as_viewer.get(RUNS, {"q": "po-42:third"})) == ["po-42"]
    assert listed(as_viewer.get(RUNS, {"q": "po-43:third"})) == []


def test_search_matches_the_beginning_of_a_run_id_not_its_middle(as_viewer: Client):
    # The beginning is read through the primary key's index; a match anywhere would read every run kept.
    escalated("po-41")
    assert listed(as_viewer.get(RUNS, {"q": "po-"})) == ["po-41"]
    assert listed(as_viewer.get(RUNS, {"q": "-41"})) == []


def test_the_workflow_filter_offers_each_workflow_once_even_one_no_longer_declared(as_viewer: Client):
    escalated("run-a")
    failed("run-b")
    make_run("order", run_id="ord-1")
    completed("run-c")
    RunState.objects.filter(pk="run-c").update(workflow="retired_flow")
    cl = as_viewer.get(RUNS).context["cl"]
    [spec] = [spec for spec in cl.filter_specs if spec.title == "workflow"]
    assert [value for value, _ in spec.lookup_choices] == ["order", "retired_flow", "scripted"]
    assert listed(as_viewer.get(RUNS, {"workflow__exact": "retired_flow"})) == ["run-c"]


def test_the_list_counts_no_further_than_its_cap_and_says_so(as_viewer: Client, monkeypatch):
    from durableruns.admin import CappedCountPaginator

    for n in range(3):
        completed(f"run-{n}")
    monkeypatch.setattr(CappedCountPaginator, "CAP", 2)
    html = as_viewer.get(RUNS).content.decode()
    assert "more than 2 runs" in html
    assert "1 run" in as_viewer.get(RUNS, {"q": "run-1"}).content.decode()


@pytest.mark.skipif(CITUS_LANE, reason="on a Citus cluster the workflow filter reads a DISTINCT every node answers")
def test_the_runs_list_reads_no_count_or_distinct_over_every_run(as_viewer: Client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    completed("run-a")
    as_viewer.get(RUNS)  # warm: the session and the plan
    with CaptureQueriesContext(connection) as seen:
        assert as_viewer.get(RUNS).status_code == 200
    sqls = [q["sql"] for q in seen.captured_queries]
    assert not [sql for sql in sqls if "SELECT DISTINCT" in sql.upper()], sqls
    counts = [sql for sql in sqls if "COUNT(" in sql.upper() and '"run_state"' in sql and "run_plan" not in sql]
    assert counts and all("LIMIT 10001" in sql for sql in counts), counts


# -- the run page -------------------------------------------------------------------------------------------


def test_the_run_page_shows_the_boundary_in_plan_order_and_every_attempt(far, as_viewer: Client):
    run_id = purchase_in_doubt()
    escalation = RunState.objects.get(pk=run_id).escalations.get()
    response = as_viewer.get(run_page(run_id))
    assert response.status_code == 200
    steps = response.context["steps"]
    assert [s["name"] for s in steps] == ["parse_request", "quote", "credit_check", "reserve_stock", "charge",
                                          "place_order", "book_shipment", "notify_buyer"]
    assert ["done" in s["badge"] for s in steps] == [True] * 7 + [False]
    notify = steps[-1]
    started = RunStep.objects.get(run_id=run_id, step="notify_buyer").started_at
    assert ">in doubt</span>" in notify["badge"]
    assert f"in doubt since {timezone.localtime(started):%Y-%m-%d %H:%M:%S}" in notify["detail"]
    assert notify["policy"] == "escalate" and notify["escalation"] == escalation
    html = response.content.decode()
    assert "7 steps complete, notify_buyer in doubt since" in html
    for step in ("charge", "notify_buyer"):
        assert f'data-step="{step}" data-attempt="1"' in html
        assert f"{run_id}:{step}" in html  # the effect key of each attempt
    assert "started, no outcome" in html and "charge_id ch_" in html
    assert f'href="/admin/durableruns/escalation/{escalation.pk}/change/"' in html
    assert "&quot;reference&quot;: &quot;PO-2026-0041&quot;" in html  # the input, pretty
    assert response.context["attempt_count"] == 8


def test_the_run_page_shows_the_runs_queue_priority_and_concurrency_key(as_viewer: Client):
    run_id = services.start_run("keyed", {"buyer": "acme-buyer"}, priority=7, queue="bulk-queue")
    page = as_viewer.get(run_page(run_id)).content.decode()
    assert "Queue and limit" in page
    assert all(f'<div class="readonly">{value}</div>' in page for value in ("bulk-queue", "7", "acme-buyer"))


def test_a_long_input_is_folded_on_the_run_page_as_the_results_are_and_a_short_one_shown(as_viewer: Client):
    lines = [{"sku": f"A-{n:03d}", "qty": n} for n in range(30)]
    long_run = make_run(input={"reference": "PO-LONG", "lines": lines})
    page = as_viewer.get(run_page(long_run)).content.decode()
    folded = page.split('<details class="dr-input">', 1)
    assert len(folded) == 2, "the long input is not folded"
    summary = folded[1].split("</summary>", 1)[0]
    assert "reference PO-LONG" in summary and "lines)" in summary
    assert "&quot;A-029&quot;" in folded[1].split("</details>", 1)[0]  # all of it, inside the fold
    short = make_run(input={"reference": "PO-SHORT"})
    page = as_viewer.get(run_page(short)).content.decode()
    assert '<details class="dr-input">' not in page and "PO-SHORT" in page


def test_the_run_page_lists_failed_attempts_errors_and_staff_actions(as_operator: Client):
    run_id = failed("run-f")
    services.retry_run(run_id, by="bob", note="the vendor fixed the card")
    response = as_operator.get(run_page(run_id))
    first = response.context["steps"][0]
    assert [a["row"].attempt for a in first["attempts"]] == [1, 2, 3]
    html = response.content.decode()
    assert "first refused" in html  # each failed attempt's error
    assert "retry the failed step" in html and "bob" in html and "the vendor fixed the card" in html


def test_the_record_is_read_only_in_the_admin(as_operator: Client, operator: User):
    run_id = escalated("run-a").run_id
    before = RunState.objects.get(pk=run_id)
    page = as_operator.get(run_page(run_id))
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    refused = as_operator.post(run_page(run_id), {"status": "completed", "cursor": 3, "reason": "edited"})
    assert refused.status_code == 403
    assert as_operator.get(f"{RUNS}add/").status_code == 403
    assert as_operator.post(f"{RUNS}{run_id}/delete/", {"post": "yes"}).status_code == 403
    after = RunState.objects.get(pk=run_id)
    assert (after.status, after.cursor, after.reason, after.updated_at) == (
        before.status, before.cursor, before.reason, before.updated_at)
    assert "delete_selected" not in dict(as_operator.get(RUNS).context["action_form"].fields["action"].choices)


def test_non_staff_are_sent_to_the_login_page():
    user = User.objects.create_user("carol", password="x-9f3-carol", is_staff=False)
    client = logged_in(user)
    for url in (RUNS, run_page(escalated("run-a").run_id)):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_staff_without_a_permission_on_runs_cannot_see_them():
    client = logged_in(staff("dave"))
    assert client.get(RUNS).status_code == 403


# -- staff actions ------------------------------------------------------------------------------------------


def test_cancel_is_confirmed_with_a_required_note_then_recorded(as_operator: Client, operator: User):
    run_id = escalated("run-a").run_id
    confirm = as_operator.post(RUNS, {"action": "cancel_runs", "_selected_action": [run_id]})
    assert confirm.status_code == 200
    assert confirm.templates[0].name == "durableruns/admin/run_action_confirmation.html"
    html = confirm.content.decode()
    assert "Cancel these runs for good?" in html and run_id in html and 'name="note"' in html
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION  # nothing yet

    no_note = as_operator.post(RUNS, {"action": "cancel_runs", "_selected_action": [run_id], "post": "yes",
                                      "note": "  "})
    assert no_note.status_code == 200 and "A note saying why is required" in no_note.content.decode()
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION
    assert not Intervention.objects.exists()

    done = as_operator.post(RUNS, {"action": "cancel_runs", "_selected_action": [run_id], "post": "yes",
                                   "note": "customer withdrew the order"}, follow=True)
    assert "Cancelled 1 run(s): run-a." in " ".join(messages_of(done))
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.CANCELLED and "customer withdrew the order" in run.reason
    act = Intervention.objects.get(run_id=run_id)
    assert (act.action, act.decided_by, act.user, act.note) == ("cancel", "alice", operator,
                                                                "customer withdrew the order")
    assert (timezone.now() - act.decided_at).total_seconds() < 60


def test_cancel_of_a_run_that_cannot_be_cancelled_says_why_and_changes_nothing(as_operator: Client):
    done_id = completed("run-c")
    open_id = escalated("run-a").run_id
    response = as_operator.post(RUNS, {"action": "cancel_runs", "_selected_action": [done_id, open_id],
                                       "post": "yes", "note": "clean up"}, follow=True)
    said = messages_of(response)
    assert any(m.startswith("run-c was not cancelled: cannot cancel a run that is completed") for m in said)
    assert any("Cancelled 1 run(s): run-a." in m for m in said)
    assert RunState.objects.get(pk=done_id).status == RunStatus.COMPLETED
    assert list(Intervention.objects.values_list("run_id", flat=True)) == ["run-a"]


def test_retry_a_failed_run_from_its_page(as_operator: Client, operator: User):
    run_id = failed("run-f")
    page = as_operator.get(run_page(run_id)).content.decode()
    assert "Retry failed run…" in page and "Cancel run…" in page
    # The page's button posts the list's action for this run: the confirmation comes first.
    confirm = as_operator.post(RUNS, {"action": "retry_runs", "_selected_action": run_id})
    assert "Give the failed step of these runs a fresh set of attempts?" in confirm.content.decode()
    done = as_operator.post(RUNS, {"action": "retry_runs", "_selected_action": run_id, "post": "yes",
                                   "note": "the vendor raised the limit"}, follow=True)
    assert "Retried 1 run(s): run-f." in " ".join(messages_of(done))
    act = Intervention.objects.get(run_id=run_id)
    assert (act.action, act.step, act.attempt, act.user) == ("retry", "first", 3, operator)
    assert RunState.objects.get(pk=run_id).status == RunStatus.PENDING
    services.resume_due(run_id=run_id)
    assert RunStep.objects.filter(run_id=run_id, step="first").count() == 6  # a new set of attempts was made


def test_retry_refuses_a_run_that_did_not_fail(as_operator: Client):
    run_id = escalated("run-a").run_id
    response = as_operator.post(RUNS, {"action": "retry_runs", "_selected_action": run_id, "post": "yes",
                                       "note": "try again"}, follow=True)
    assert "run-a was not retried: this run waits for a decision on its escalation" in " ".join(
        messages_of(response))
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION
    assert not Intervention.objects.exists()


def test_actions_need_their_permissions(as_viewer: Client):
    run_id = failed("run-f")
    assert as_viewer.get(RUNS).context["action_form"] is None  # no action offered at all
    page = as_viewer.get(run_page(run_id)).content.decode()
    assert "Cancel run…" not in page and "Retry failed run…" not in page
    for action in ("cancel_runs", "retry_runs"):
        response = as_viewer.post(RUNS, {"action": action, "_selected_action": run_id, "post": "yes",
                                         "note": "sneaky"})
        assert response.status_code == 200  # the list again: the action does not exist for this user
        assert "durableruns/admin/run_action_confirmation.html" not in [t.name for t in response.templates]
    assert RunState.objects.get(pk=run_id).status == RunStatus.FAILED
    assert not Intervention.objects.exists()


def test_a_user_with_only_the_cancel_permission_sees_runs_and_may_cancel_not_retry():
    client = logged_in(staff("erin", "cancel_run"))
    run_id = failed("run-f")
    choices = dict(client.get(RUNS).context["action_form"].fields["action"].choices)
    assert "cancel_runs" in choices and "retry_runs" not in choices
    client.post(RUNS, {"action": "cancel_runs", "_selected_action": run_id, "post": "yes", "note": "stop it"})
    assert RunState.objects.get(pk=run_id).status == RunStatus.CANCELLED


def test_a_run_of_a_workflow_this_deploy_does_not_know_still_shows_its_record(as_viewer: Client):
    run_id = escalated("run-a").run_id
    RunState.objects.filter(pk=run_id).update(workflow="retired_flow")
    assert "2 steps complete, third in doubt since" in as_viewer.get(RUNS).content.decode()
    response = as_viewer.get(run_page(run_id))
    assert response.status_code == 200
    steps = response.context["steps"]  # through the run's own recorded plan: its policies too
    assert [(s["name"], s["policy"]) for s in steps] == [("first", "re_executable"), ("second", "resolvable"),
                                                         ("third", "escalate")]
    assert ">in doubt</span>" in steps[2]["badge"]
    # A plan that was never recorded: the steps as attempted, their policies unknown.
    RunState.objects.filter(pk=run_id).update(plan_fingerprint="0123456789abcdef")
    steps = as_viewer.get(run_page(run_id)).context["steps"]
    assert [(s["name"], s["policy"]) for s in steps] == [("first", "unknown"), ("second", "unknown"),
                                                         ("third", "unknown")]


def test_whoever_may_decide_escalations_may_also_look_at_runs():
    client = logged_in(staff("dora", "decide_escalation"))
    run_id = escalated("run-a").run_id
    assert listed(client.get(RUNS)) == [run_id]
    assert client.get(run_page(run_id)).status_code == 200
    assert client.get(RUNS).context["action_form"] is None  # looking is all: no cancel, no retry
