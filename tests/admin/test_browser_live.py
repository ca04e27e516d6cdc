"""The run page of an active run updates itself in a real browser (headless Chromium, as test_browser.py drives
it): a progress report and an attempt's completion, written through the store as a worker writes them, appear
within 2 s, without a reload."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, expect

from durableruns import store
from tests.admin.test_browser import browser, shoot, sync_playwright_may_use_the_orm  # noqa: F401  (fixtures)
from tests.admin.test_progress import reporting_run
from tests.admin.users import VIEW, staff

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_active_runs_page_shows_new_progress_and_attempt_states_within_two_seconds(live_server, browser: Browser):  # noqa: F811
    run_id = reporting_run()
    staff("viola", *VIEW)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/durableruns/runstate/{run_id}/change/")
    page.fill("#id_username", "viola")
    page.fill("#id_password", "pw-viola-9f3")
    page.click("input[type=submit]")
    line = page.locator("#dr-progress-line")
    expect(line).to_have_text("crawl: crawled 3 (3/5)")
    loaded = page.evaluate("performance.timeOrigin")

    lease = store.Lease(run_id=run_id, owner="dead-worker", epoch=1, seconds=30)
    store.record_progress(lease, step="crawl", attempt=1, message="crawled 4", done=4, total=5)
    expect(line).to_have_text("crawl: crawled 4 (4/5)", timeout=2_000)
    expect(page.locator("#dr-progress-bar")).to_have_attribute("value", "4", timeout=2_000)
    shoot(page, "run_live_progress.png")

    state = page.locator('#dr-attempts tr[data-step="crawl"][data-attempt="1"] .dr-live-state')
    before = state.inner_text()
    store.record_result(lease, step="crawl", attempt=1, result={"crawled": 5}, cursor=1)
    expect(state).not_to_have_text(before, timeout=2_000)
    expect(state).to_have_text(re.compile("completed|done|returned", re.I), timeout=2_000)
    assert page.evaluate("performance.timeOrigin") == loaded  # the same page: updated in place, never reloaded
