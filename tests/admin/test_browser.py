"""The back office in headless Chromium (Debian's, driven by Playwright without a browser download).

A staff user logs in through the login page, finds the run whose notify_buyer is in doubt, decides it in the
escalation queue, lets resume_runs act on the decision, and sees the run completed. Screenshots of each
screen are saved as test artefacts (SCREENSHOT_DIR), and into docs/screenshots with UPDATE_DOCS_SCREENSHOTS=1.
"""

from __future__ import annotations

import os
import re
from io import StringIO
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections
from playwright.sync_api import Browser, Page, expect, sync_playwright

import durableruns
from durableruns import services
from durableruns.models import Escalation, Intervention, RunState, RunStatus
from tests.admin.users import OPERATE, VIEW, staff
from tests.admin.records import purchase_in_doubt

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(autouse=True)
def sync_playwright_may_use_the_orm(monkeypatch: pytest.MonkeyPatch) -> None:
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes here are still
    # plain synchronous calls, so Django's async-safety guard is lifted for this module only.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
            # While Playwright's loop runs, this thread sees its own context, so the ORM opened a connection
            # of its own for the test body; close it here, before leaving the context loses track of it.
            connections.close_all()


def shoot(page: Page, name: str) -> None:
    """Save a screenshot as a test artefact, and for the README when UPDATE_DOCS_SCREENSHOTS=1."""
    folders = [Path(os.environ.get("SCREENSHOT_DIR") or ROOT / "test-artifacts" / "screenshots")]
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1":
        folders.append(ROOT / "docs" / "screenshots")
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / name), full_page=True)


def test_staff_decide_an_in_doubt_notify_buyer_and_see_the_run_completed(live_server, far, browser: Browser):
    # Two runs beside it, so the list looks like a day's work: one completed, one the credit vendor refused.
    services.start_run("purchase_order", {"reference": "PO-2026-0039", "buyer": "Acme Ltd", "line_count": 2},
                       run_id="PO-2026-0039")
    services.start_run("purchase_order", {"reference": "PO-2026-0040", "buyer": "Overdrawn Traders"},
                       run_id="PO-2026-0040")
    services.resume_due()
    run_id = purchase_in_doubt()
    operator = staff("alice", *OPERATE)
    escalation = Escalation.objects.get(run_id=run_id)
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    # Screenshots show the page, not Django's navigation sidebar.
    page.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.set_default_timeout(10_000)

    # Log in through the login page, as a person would.
    page.goto(f"{live_server.url}/admin/durableruns/runstate/")
    expect(page).to_have_url(re.compile(r"/admin/login/"))
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw-alice-9f3")
    page.click("input[type=submit]")

    # The runs list: the run and the sentence that says where it stands.
    row = page.locator("#result_list tbody tr", has_text=run_id)
    expect(row).to_contain_text("needs decision")
    expect(row).to_contain_text("7 steps complete, notify_buyer in doubt since")
    shoot(page, "runs_list.png")

    # The run page: the boundary in plan order, notify_buyer in doubt, its attempt with its effect key.
    row.get_by_role("link", name=run_id).click()
    expect(page.locator("#dr-sentence")).to_contain_text("notify_buyer in doubt since")
    notify = page.locator("#dr-boundary tr[data-step=notify_buyer]")
    expect(notify).to_contain_text("in doubt")
    expect(page.locator("#dr-boundary tr[data-step=charge]")).to_contain_text("done")
    expect(page.locator("#dr-attempts tr[data-step=notify_buyer]")).to_contain_text(f"{run_id}:notify_buyer")
    shoot(page, "run_in_doubt.png")

    # The queue: the escalation with how to check the email sender by hand and what the run holds.
    page.get_by_role("link", name=f"decide it (escalation #{escalation.pk})").click()
    page.get_by_role("link", name="Escalation queue").click()
    queued = page.locator("#result_list tbody tr", has_text=run_id)
    expect(queued).to_contain_text("check the sender's outbox")
    expect(queued).to_contain_text(re.compile(r"reserve_stock held since \d\d:\d\d, lapses in 3 h 5\d min"))
    shoot(page, "escalation_queue.png")

    # Decide: it happened (the email is in the outbox), with a note.
    queued.get_by_role("link", name=f"#{escalation.pk}").click()
    page.fill("#id_note", "Found 'PO-2026-0041 has shipped' in the sender's outbox, sent 14:09.")
    shoot(page, "escalation_decide.png")
    page.get_by_role("button", name="It happened").click()
    expect(page.locator("ul.messagelist")).to_contain_text("Recorded “it happened”")
    decision = Intervention.objects.get(escalation=escalation)
    assert (decision.decided_by, decision.action, decision.user_id) == ("alice", "happened", operator.pk)

    # resume_runs acts on the decision; the runs list shows the run completed.
    out = StringIO()
    call_command("resume_runs", stdout=out)
    assert "1 completed" in out.getvalue()
    page.goto(f"{live_server.url}/admin/durableruns/runstate/")
    row = page.locator("#result_list tbody tr", has_text=run_id)
    expect(row).to_contain_text("completed")
    expect(row).to_contain_text("all 8 steps complete")
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    subjects = [e["payload"]["subject"] for e in far.email.effects()]
    assert "PO-2026-0039 has shipped" in subjects  # the completed run's email: the ledger is read right
    assert "PO-2026-0041 has shipped" not in subjects  # decided as happened: not sent (again) by the resume



def test_a_run_page_draws_its_plan_box_for_box_with_its_child_runs(live_server, far, browser: Browser):
    # The demo's full purchase order with three warehouses, at its join: shipments booked as child runs, one done.
    run_id = services.start_run("full_purchase_order", {"reference": "PO-2026-0042", "buyer": "Quay Bakery",
                                                        "line_count": 6,
                                                        "warehouses": ["Rotterdam", "Hamburg", "Antwerp"]},
                                run_id="PO-2026-0042")
    services.resume_due(run_id=run_id)
    durableruns.send(run_id, "supplier_confirmed", {"backorder": False}, key="m-42")
    services.resume_due(run_id=run_id)
    services.resume_due(run_id=f"{run_id}/book_shipments/Antwerp")
    plan = services.plan_of(RunState.objects.get(pk=run_id))
    assert plan is not None and services.run_boundary(run_id).waiting == {"shipments_booked": "join"}
    staff("viola", *VIEW)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/durableruns/runstate/{run_id}/change/")
    page.fill("#id_username", "viola")
    page.fill("#id_password", "pw-viola-9f3")
    page.click("input[type=submit]")

    picture = page.locator("#dr-plan svg.dr-plan")
    expect(picture).to_be_visible()
    expect(picture.locator("g.dr-plan-step")).to_have_count(len(plan))
    expect(picture.locator("g.dr-plan-child")).to_have_count(3)
    expect(picture.locator("g.dr-plan-step[data-step=shipments_booked]")).to_have_attribute("data-state", "waiting")
    expect(picture.locator("g.dr-plan-step[data-step=manager_approval]")).to_have_attribute("data-state", "skipped")
    expect(picture.locator("g.dr-plan-child[data-state=done]")).to_have_count(1)
    box = picture.bounding_box()
    assert box is not None and box["width"] > 600 and box["height"] > 9 * 46  # drawn, not collapsed
    steps = picture.locator("g.dr-plan-step").evaluate_all("gs => gs.map(g => g.getBoundingClientRect().top)")
    assert steps == sorted(steps)  # in plan order, top to bottom
    expect(page.get_by_role("img", name=f"The plan of run {run_id} (full_purchase_order)")).to_be_visible()
    page.locator("#dr-plan summary").click()
    expect(page.locator("#dr-plan li[data-step=shipments_booked]")).to_contain_text("join: waits for its child runs")
    folders = [Path(os.environ.get("SCREENSHOT_DIR") or ROOT / "test-artifacts" / "screenshots")]
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1":
        folders.append(ROOT / "docs" / "_static")
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        page.locator("#dr-plan").screenshot(path=str(folder / "plan-drawn.png"))
