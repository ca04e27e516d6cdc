"""Restart from a step in headless Chromium: staff with durableruns.restart_run open an ended run's page, choose
"restart from here" on charge, confirm with a note, and land on the new run's page, which links back."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, expect

from durableruns import services
from durableruns.models import Intervention, RunState, RunStatus
from tests.admin.test_browser import browser, sync_playwright_may_use_the_orm  # noqa: F401  (fixtures)
from tests.admin.users import VIEW, staff
from tests.factories import make_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_staff_restart_a_completed_run_from_charge_and_see_both_runs_linked(
    live_server, far, browser: Browser  # noqa: F811  (the fixture imported above)
):
    run_id = make_run("order", run_id="PO-2026-0041")
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    staff("rita", *VIEW, "restart_run")
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/durableruns/runstate/{run_id}/change/")
    expect(page).to_have_url(re.compile(r"/admin/login/"))
    page.fill("#id_username", "rita")
    page.fill("#id_password", "pw-rita-9f3")
    page.click("input[type=submit]")

    page.locator("#dr-boundary tr[data-step=charge]").get_by_role("link", name="restart from here").click()
    expect(page.locator("#dr-restart-question")).to_contain_text("from charge")
    page.fill("#id_note", "pricing fix deployed (INC-2211)")
    page.get_by_role("button", name="Yes, restart from charge").click()

    new = RunState.objects.get(restarted_from=run_id)
    expect(page.locator("ul.messagelist")).to_contain_text(f"Restarted {run_id} from charge as {new.run_id}")
    expect(page.locator("#dr-restarts")).to_contain_text(f"Restarts {run_id} from charge")
    page.locator("#dr-restarts").get_by_role("link", name=run_id).click()
    expect(page.locator("#dr-restarts")).to_contain_text(f"as {new.run_id} by rita")
    assert Intervention.objects.filter(action="restart", decided_by="rita").count() == 2
