"""The inbox in the back office (issue 33): /admin/durableruns/inbox/ lists the open approvals and escalations for
the person signed in, the overdue first, with Take and Release; its entry in the sidebar and the app index names
its count, beside the approval queue's; items of runs out of scope are in no list or count."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group

import durableruns
from durableruns import services
from durableruns.models import InboxItem, Intervention, RunState, RunStatus
from tests import inbox_workflows as flows
from tests.admin.users import VIEW, logged_in, staff

pytestmark = pytest.mark.django_db(transaction=True)

INBOX = "/admin/durableruns/inbox/"


def member(name: str, *groups: str, perms=(*VIEW, "decide_approval", "decide_escalation")):
    user = staff(name, *perms)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def waiting(desk: str = "north") -> InboxItem:
    run_id = durableruns.start("inbox_order", {"desk": desk})
    services.resume_due(run_id=run_id)
    return InboxItem.objects.get(run_id=run_id)


def test_the_inbox_lists_the_persons_items_with_take_and_release():
    late, soon = waiting("Desk A"), waiting("Desk B")
    InboxItem.objects.filter(pk=late.pk).update(due_at=late.opened_at - timedelta(minutes=1))
    client = logged_in(member("mia", flows.MANAGERS))
    page = client.get(INBOX)
    assert page.status_code == 200
    html = page.content.decode()
    assert html.index(f'data-item="{late.pk}"') < html.index(f'data-item="{soon.pk}"')
    assert "dr-item-overdue" in html and "Desk A" in html and flows.MANAGERS in html
    assert html.count('value="take"') == 2 and 'value="release"' not in html
    taken = client.post(INBOX, {"item": late.pk, "act": "take"}, follow=True)
    assert "You hold manager_approval" in taken.content.decode()
    assert InboxItem.objects.get(pk=late.pk).claimed_by == "mia"
    assert 'value="release"' in taken.content.decode()
    # another manager does not see what mia holds, and cannot take it
    other = logged_in(member("max", flows.MANAGERS))
    assert f'data-item="{late.pk}"' not in other.get(INBOX).content.decode()
    refused = other.post(INBOX, {"item": late.pk, "act": "take"}, follow=True).content.decode()
    assert "Nothing was recorded: taken by mia since" in refused
    released = client.post(INBOX, {"item": late.pk, "act": "release"}, follow=True)
    assert "Released manager_approval" in released.content.decode()
    assert list(Intervention.objects.filter(run_id=late.run_id).values_list("action", flat=True).order_by("pk")) == [
        "take",
        "release",
    ]
    assert client.post(INBOX, {"item": "nonsense", "act": "take"}, follow=True).status_code == 200


def test_the_sidebar_and_app_index_name_the_inbox_with_its_count_and_the_approval_queue(settings):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"inbox_payroll": ["Payroll"]}
    waiting()
    payroll = durableruns.start("inbox_payroll", {})
    services.resume_due(run_id=payroll)
    client = logged_in(member("mia", flows.MANAGERS))
    index = client.get("/admin/durableruns/").content.decode()
    assert 'href="/admin/durableruns/inbox/"' in index and "Inbox (1)" in index  # the payroll's is out of scope
    assert 'href="/admin/durableruns/approvalqueue/"' in index and "Approval queue" in index
    assert "Inbox (1)" in client.get("/admin/").content.decode()
    assert client.get("/admin/durableruns/approvalqueue/").url == "/admin/durableruns/runstate/approvals/"
    inbox_page = client.get(INBOX + "?all=1").content.decode()
    assert f"{payroll}" not in inbox_page
    paid = logged_in(member("paula", "Payroll"))  # the payroll's item is hers; the managers' is not
    assert "Inbox (1)" in paid.get("/admin/durableruns/").content.decode()
    assert payroll in paid.get(INBOX).content.decode()


def test_without_a_permission_to_decide_there_is_no_inbox():
    waiting()
    client = logged_in(staff("viola", *VIEW))
    assert client.get(INBOX).status_code == 403
    assert "/admin/durableruns/inbox/" not in client.get("/admin/durableruns/").content.decode()


def test_reject_asks_for_its_note_approve_does_not():
    first, second = waiting(), waiting()
    client = logged_in(member("mia", flows.MANAGERS))
    approvals = "/admin/durableruns/runstate/approvals/"
    said = client.post(
        approvals, {"run_id": first.run_id, "step": "manager_approval", "outcome": "reject", "note": " "}, follow=True
    ).content.decode()
    assert "a rejection needs a note" in said
    assert not Intervention.objects.filter(run_id=first.run_id).exists()
    client.post(approvals, {"run_id": second.run_id, "step": "manager_approval", "outcome": "approve", "note": ""})
    assert Intervention.objects.get(run_id=second.run_id).action == "approve"
    services.resume_due(run_id=second.run_id)
    assert RunState.objects.get(pk=second.run_id).status != RunStatus.WAITING
    # the inbox opens one run's approval
    page = client.get(f"{approvals}?run={first.run_id}").content.decode()
    assert first.run_id in page and "every approval" in page


def test_the_dashboard_names_the_persons_inbox_and_its_overdue_items():
    late, _ = waiting(), waiting()
    InboxItem.objects.filter(pk=late.pk).update(due_at=late.opened_at - timedelta(minutes=1))
    page = logged_in(member("mia", flows.MANAGERS)).get("/admin/durableruns/").content.decode()
    assert "Your inbox: 2 items" in page and "1 overdue" in page
    assert "Your inbox: 0 items" in logged_in(member("carl")).get("/admin/durableruns/").content.decode()
