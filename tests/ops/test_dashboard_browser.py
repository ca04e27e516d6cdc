"""The dashboard in headless Chromium: staff log in, the durableruns section opens on the four charts, a bar
leads to its filtered list. The screenshot is a test artefact, and docs/screenshots/dashboard.png with
UPDATE_DOCS_SCREENSHOTS=1 (as tests/admin/test_browser.py does)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from playwright.sync_api import Browser, expect

from durableruns.clock import Clock
from durableruns.models import RunState, RunStatus, RunStep
from tests.admin.test_browser import browser, shoot, sync_playwright_may_use_the_orm  # noqa: F401  fixtures
from tests.admin.users import OPERATE, staff
from tests.ops.records import aged_run, escalate

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def a_days_work() -> None:
    """A day of runs as a site sees them: most completed through the day, some failed, a backlog, escalations."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
            "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
            "SELECT 'PO-2026-' || lpad(g::text, 5, '0'), "
            "(ARRAY['purchase_order', 'purchase_order', 'order', 'refund'])[1 + g % 4], 'f', "
            "CASE WHEN g % 37 = 0 THEN 'failed' WHEN g % 53 = 0 THEN 'cancelled' WHEN g > 1880 THEN 'pending' "
            "ELSE 'completed' END, 0, '', 0, NULL, NULL, '', '{}'::jsonb, "
            "now() - (g % 24) * interval '1 hour' - interval '5 minutes', "
            "now() - (g % 24) * interval '1 hour' - (abs(hashtext(g::text)) % 3000) * interval '1 second' "
            "FROM generate_series(1, 1900) g"
        )
    now = Clock().now()
    for workflow, hours in (("purchase_order", 0.4), ("purchase_order", 3), ("refund", 7), ("order", 30)):
        run = aged_run(RunStatus.NEEDS_DECISION, attempts=0)
        RunState.objects.filter(pk=run).update(workflow=workflow)
        escalate(run, opened_ago=timedelta(hours=hours))
        RunStep.objects.create(
            run_id=run,
            step="second",
            attempt=1,
            status="started",
            effect_key=f"{run}:k",
            started_at=now - timedelta(hours=hours),
            owner="w",
            epoch=1,
        )
    for _ in range(2):
        run = aged_run(RunStatus.RUNNING, workflow="order", attempts=0, lease_expires_at=now - timedelta(minutes=3))
        RunStep.objects.create(
            run_id=run,
            step="first",
            attempt=1,
            status="started",
            effect_key=f"{run}:k",
            started_at=now - timedelta(minutes=5),
            owner="gone",
            epoch=1,
        )


def test_the_durableruns_section_opens_on_the_dashboard(live_server, browser: Browser):  # noqa: F811
    a_days_work()
    staff("alice", *OPERATE)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/durableruns/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw-alice-9f3")
    page.click("input[type=submit]")
    expect(page).to_have_url(re.compile(r"/admin/durableruns/$"))
    board = page.locator("#durableruns-dashboard")
    expect(board.locator("svg")).to_have_count(4)
    expect(page.locator("#dr-chart-status")).to_contain_text("completed")
    expect(page.locator("#dr-chart-escalations")).to_contain_text("over 3 days")
    expect(page.locator("#dr-chart-in_doubt")).to_contain_text("purchase_order")
    shoot(page, "dashboard.png")
    # A bar is a link to the list it counts.
    page.locator('#dr-chart-status a[aria-label^="failed:"] rect').click()
    expect(page).to_have_url(re.compile(r"/admin/durableruns/runstate/\?status__exact=failed$"))
    expect(page.locator("#result_list tbody tr").first).to_contain_text("failed")
