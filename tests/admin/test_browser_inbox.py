"""The inbox in headless Chromium (issue 33): a purchasing manager finds the inbox in the sidebar with its count,
takes an approval, sees it held, releases it, opens it in the approval queue whose Approve and Reject are distinct
(Reject asking for its note); the escalation queue at 1366 px keeps its how-to-check column in view."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import Browser, Page, expect

import durableruns
from durableruns import services
from durableruns.models import InboxItem, Intervention
from tests import inbox_workflows as flows
from tests.admin.records import purchase_in_doubt
from tests.admin.test_browser import browser, shoot, sync_playwright_may_use_the_orm  # noqa: F401  (fixtures)
from tests.admin.users import OPERATE, VIEW, staff

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LAPTOP = {"width": 1366, "height": 768}


def log_in(page: Page, url: str, username: str) -> None:
    page.goto(f"{url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}-9f3")
    page.click("input[type=submit]")


def waiting(desk: str, total: int) -> InboxItem:
    run_id = durableruns.start("inbox_order", {"desk": desk, "total": total})
    services.resume_due(run_id=run_id)
    return InboxItem.objects.get(run_id=run_id)


def test_a_manager_takes_and_releases_an_approval_from_the_inbox(live_server, browser: Browser):  # noqa: F811
    late, _ = waiting("Desk north", 12_400), waiting("Desk south", 3_100)
    InboxItem.objects.filter(pk=late.pk).update(due_at=late.opened_at - timedelta(minutes=20))
    mia = staff("mia", *VIEW, "decide_approval", "decide_escalation")
    mia.groups.add(Group.objects.create(name=flows.MANAGERS))
    page = browser.new_page(viewport=LAPTOP)
    page.set_default_timeout(10_000)
    log_in(page, live_server.url, "mia")

    # The sidebar and the app index: the inbox with its count, the approval queue beside it.
    page.goto(f"{live_server.url}/admin/durableruns/")
    app = page.locator("#content-main .app-durableruns")
    expect(app.get_by_role("link", name="Inbox (2)")).to_be_visible()
    expect(app.get_by_role("link", name="Approval queue")).to_be_visible()
    expect(page.locator("#dr-dashboard-inbox")).to_contain_text("Your inbox: 2 items, 1 overdue")

    # The inbox: the overdue first, its due time in red, each item with Take; the sidebar names it and the
    # approval queue (the admin's index pages have no sidebar: the list pages do).
    app.get_by_role("link", name="Inbox (2)").click()
    sidebar = page.locator("#nav-sidebar")
    expect(sidebar.get_by_role("link", name="Inbox (2)")).to_have_count(1)
    expect(sidebar.get_by_role("link", name="Approval queue")).to_have_count(1)
    rows = page.locator("#dr-inbox tbody tr")
    expect(rows).to_have_count(2)
    first = rows.nth(0)
    expect(first).to_contain_text(late.run_id)
    expect(first).to_contain_text("Desk north")
    expect(first).to_contain_text(flows.MANAGERS)
    expect(first.locator(".dr-due")).to_contain_text("overdue")
    assert first.locator(".dr-due").evaluate("e => getComputedStyle(e).color") == "rgb(198, 40, 40)"
    assert rows.nth(1).locator(".dr-due").evaluate("e => getComputedStyle(e).color") != "rgb(198, 40, 40)"
    for i in range(2):  # every column, the buttons included, within 1366 px
        box = rows.nth(i).locator(".dr-acts").bounding_box()
        assert box is not None and box["x"] + box["width"] <= LAPTOP["width"], box
    first.get_by_role("button", name="Take").click()
    expect(page.locator("ul.messagelist")).to_contain_text("You hold manager_approval")
    held = page.locator(f"#dr-inbox tr[data-item='{late.pk}']")
    expect(held.locator(".dr-holder")).to_contain_text("you")
    expect(held.get_by_role("button", name="Take")).to_have_count(0)
    shoot(page, "inbox.png")
    assert InboxItem.objects.get(pk=late.pk).claimed_by == "mia"

    held.get_by_role("button", name="Release").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Released manager_approval")
    expect(page.locator(f"#dr-inbox tr[data-item='{late.pk}']").get_by_role("button", name="Take")).to_be_visible()
    assert list(Intervention.objects.filter(run_id=late.run_id).values_list("action", flat=True)) == [
        "release",
        "take",
    ]  # newest first

    # It opens in the approval queue: Approve and Reject are two buttons, and Reject asks for its note.
    page.locator(f"#dr-inbox tr[data-item='{late.pk}']").get_by_role("link", name="Approve or reject").click()
    approval = page.locator(f".dr-approval[data-run='{late.run_id}']")
    expect(page.locator(".dr-approval")).to_have_count(1)
    # The approval queue fits the laptop's width too: no sideways scroll, both buttons in view.
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    for name in ("Approve", "Reject"):
        box = approval.get_by_role("button", name=name).bounding_box()
        assert box is not None and box["x"] + box["width"] <= LAPTOP["width"], (name, box)
    approval.get_by_role("button", name="Reject").click()
    expect(page.locator("ul.messagelist")).to_contain_text("a rejection needs a note")
    assert not Intervention.objects.filter(run_id=late.run_id, action__in=("approve", "reject")).exists()
    approval = page.locator(f".dr-approval[data-run='{late.run_id}']")
    approval.locator("textarea").fill("Over the quarter's budget.")
    approval.get_by_role("button", name="Reject").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Recorded “reject”")
    assert Intervention.objects.get(run_id=late.run_id, action="reject").note == "Over the quarter's budget."


@pytest.mark.parametrize("sidebar", ["open", "closed"])
def test_the_escalation_queue_keeps_its_how_to_check_column_in_view_at_1366_px(
    live_server,
    far,
    browser: Browser,  # noqa: F811
    sidebar: str,
):
    run_id = purchase_in_doubt()
    staff("alice", *OPERATE)
    page = browser.new_page(viewport=LAPTOP)
    page.add_init_script(f"localStorage.setItem('django.admin.navSidebarIsOpen', '{str(sidebar == 'open').lower()}')")
    log_in(page, live_server.url, "alice")
    page.goto(f"{live_server.url}/admin/durableruns/escalation/")
    row = page.locator("#result_list tbody tr", has_text=run_id)
    expect(row).to_contain_text("check the sender's outbox")
    # Inside the viewport and inside the list's own scrolling box: visible, not cut off nor scrolled out of view.
    results = page.locator("#changelist .results").bounding_box()
    assert results is not None
    right = min(LAPTOP["width"], results["x"] + results["width"])
    for cell in (
        row.locator("td.field-how_to_check"),
        page.locator("#result_list thead th.column-how_to_check"),
        row.locator("td.field-the_run_holds"),
    ):
        box = cell.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= right, (box, results)
    overflow = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results'); return [r.scrollWidth, r.clientWidth]; }"
    )
    assert overflow[0] <= overflow[1], overflow  # the list does not scroll sideways
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    expect(page.locator("#result_list")).to_contain_text(re.compile("how to check", re.I))
    expect(page.locator("#changelist-filter").get_by_role("link", name="decided")).to_be_visible()
    shoot(page, f"escalation_queue_1366_sidebar_{sidebar}.png")  # a test artefact, not the docs' screenshot
