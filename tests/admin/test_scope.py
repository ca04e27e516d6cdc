"""DURABLERUNS_WORKFLOW_GROUPS in the back office: a user outside a scoped workflow's groups finds its runs in no
list, search, filter, count, queue or dashboard bar, its run pages say they do not exist, and a family's links
leave it out; a member of its group and a superuser see it as before."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User

import durableruns
from durableruns import schedules, services
from durableruns.models import Intervention, RunState
from tests.admin.users import OPERATE, logged_in, staff
from tests.api.conftest import escalated_run
from tests.ops.test_dashboard import bars

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"


def linked(html: str) -> set[str]:
    """The ids of the runs a page links to."""
    return set(re.findall(r'/admin/durableruns/runstate/([^/"]+)/change/', html))
APPROVALS = "/admin/durableruns/runstate/approvals/"


@pytest.fixture(autouse=True)
def scoped(settings, monkeypatch):
    """`scripted` and `waiting` are the payroll's, seen by its group; the other workflows are everyone's."""
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"scripted": ["Payroll"], "waiting": ["Payroll", "Finance"]}
    monkeypatch.setattr(schedules, "_declared", {})


@pytest.fixture
def clerk() -> User:
    return staff("clerk", *OPERATE, "decide_approval", "view_schedulestate")


@pytest.fixture
def payroll() -> User:
    user = staff("pam", *OPERATE, "decide_approval", "view_schedulestate")
    user.groups.add(Group.objects.create(name="Payroll"))
    return user


def test_lists_search_and_filters_leave_a_scoped_workflows_runs_out(clerk, payroll):
    durableruns.start("scripted", {}, run_id="salary-nov")
    durableruns.start("order", {}, run_id="po-17")
    as_clerk, as_payroll = logged_in(clerk), logged_in(payroll)
    listed = as_clerk.get(RUNS).content.decode()
    assert linked(listed) == {"po-17"}
    assert "?workflow__exact=scripted" not in listed  # not offered as a filter choice either
    for query in ("?q=salary", "?q=salary-nov:first", "?workflow__exact=scripted", "?status__exact=pending"):
        assert "salary-nov" not in linked(as_clerk.get(RUNS + query).content.decode()), query
    assert linked(as_payroll.get(RUNS + "?q=salary").content.decode()) == {"salary-nov"}
    assert "?workflow__exact=scripted" in as_payroll.get(RUNS).content.decode()


def test_a_scoped_runs_page_does_not_exist_for_someone_outside_and_its_actions_change_nothing(clerk, payroll):
    durableruns.start("scripted", {}, run_id="salary-dec")
    as_clerk = logged_in(clerk)
    page = as_clerk.get(f"{RUNS}salary-dec/change/")
    assert page.status_code == 302 and page.url == "/admin/"  # Django's answer for a record that does not exist
    assert "doesn’t exist" in as_clerk.get("/admin/").content.decode()
    # an action posted with the run's id ticked (a crafted form) acts on none: the queryset it gets is scoped
    as_clerk.post(RUNS, {"action": "cancel_runs", "_selected_action": ["salary-dec"], "note": "x", "apply": "1"})
    assert RunState.objects.get(pk="salary-dec").status == "pending"
    assert not Intervention.objects.exists()
    assert logged_in(payroll).get(f"{RUNS}salary-dec/change/").status_code == 200


def test_the_queues_and_the_dashboard_count_only_what_the_user_may_see(clerk, payroll, far):
    escalation = escalated_run("salary-esc")
    durableruns.start("waiting", {"total": 50_000}, run_id="salary-approval")
    services.resume_due()
    as_clerk, as_payroll = logged_in(clerk), logged_in(payroll)
    queue = as_clerk.get("/admin/durableruns/escalation/").content.decode()
    assert "salary-esc" not in queue
    page = as_clerk.get(f"/admin/durableruns/escalation/{escalation.pk}/change/")
    assert page.status_code == 302 and page.url == "/admin/durableruns/escalation/"  # "there is no escalation #N"
    decided = as_clerk.post(f"/admin/durableruns/escalation/{escalation.pk}/change/",
                            {"outcome": "happened", "note": "seen in the bank"})
    assert decided.status_code == 302 and not Intervention.objects.filter(run_id="salary-esc").exists()
    approvals = as_clerk.get(APPROVALS).content.decode()
    assert "salary-approval" not in approvals and "No run waits for an approval." in approvals
    posted = as_clerk.post(APPROVALS, {"run_id": "salary-approval", "step": "manager_approval", "outcome": "approve",
                                       "note": "fine"}, follow=True).content.decode()
    assert "Nothing was recorded" in posted and not Intervention.objects.filter(run_id="salary-approval").exists()
    assert "salary-esc" in as_payroll.get("/admin/durableruns/escalation/").content.decode()
    assert "salary-approval" in as_payroll.get(APPROVALS).content.decode()

    def counts(client) -> dict[str, int]:
        html = client.get("/admin/durableruns/").content.decode()
        return {label: value for label, (value, _) in {**bars(html, "status"), **bars(html, "escalations")}.items()}

    mine, theirs = counts(as_clerk), counts(as_payroll)
    assert sum(v for k, v in mine.items()) == 0, mine
    assert (theirs["needs decision"], theirs["waiting"], theirs["under 1 hour"]) == (1, 1, 1), theirs


def test_a_family_leaves_out_the_runs_out_of_scope(clerk):
    parent = durableruns.start("order", {}, run_id="po-parent")
    durableruns.start("scripted", {}, run_id="salary-child")
    durableruns.start("order", {}, run_id="po-child")
    RunState.objects.filter(pk__in=["salary-child", "po-child"]).update(parent_id=parent)
    page = logged_in(clerk).get(f"{RUNS}po-parent/change/").content.decode()
    assert linked(page) >= {"po-child"} and "salary-child" not in page
    RunState.objects.filter(pk="po-child").update(parent_id="salary-child")
    child_page = logged_in(clerk).get(f"{RUNS}po-child/change/").content.decode()
    assert "a run outside your workflows" in child_page and "salary-child" not in child_page


def test_a_scheduled_workflow_out_of_scope_is_not_on_the_schedules_page(clerk, payroll):
    durableruns.schedule("monthly_payroll", "scripted", "0 6 1 * *")
    durableruns.schedule("hourly_sync", "ticked", "0 * * * *")
    schedules.start_due()
    page = logged_in(clerk).get("/admin/durableruns/schedulestate/").content.decode()
    assert "hourly_sync" in page and "monthly_payroll" not in page
    assert "monthly_payroll" in logged_in(payroll).get("/admin/durableruns/schedulestate/").content.decode()


def test_a_superuser_sees_every_workflow():
    durableruns.start("scripted", {}, run_id="salary-root")
    root = User.objects.create_superuser("root", password="pw-root-9f3")
    assert "salary-root" in logged_in(root).get(RUNS).content.decode()
    assert re.search(r"salary-root", logged_in(root).get(f"{RUNS}salary-root/change/").content.decode())


def test_a_malformed_scope_is_a_system_check_error_and_a_misspelt_workflow_a_warning(settings):
    from durableruns.checks import check_workflow_groups

    settings.DURABLERUNS_WORKFLOW_GROUPS = {"scripted": "Payroll"}
    (error,) = check_workflow_groups()
    assert error.id == "durableruns.E032" and "list of group names" in error.msg
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"payrol": ["Payroll"]}
    (warning,) = check_workflow_groups()
    assert warning.id == "durableruns.W006" and "'payrol'" in warning.msg
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"scripted": ["Payroll"]}
    assert check_workflow_groups() == []
