"""Bulk acts in headless Chromium: staff filter the runs list to the failed runs, tick the page, choose "select all
N", retry them with a note, and land on the bulk's progress page, which reloads itself until the workers have
acted on every run (the one that stopped fitting listed with its reason)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, expect

from durableruns import bulks, services
from durableruns.bulk_models import Bulk
from durableruns.models import Intervention, RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import effect_key, get_workflow
from tests.admin.test_browser import browser, shoot, sync_playwright_may_use_the_orm  # noqa: F401  (fixtures)
from tests.admin.users import VIEW, staff

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FAILED = 130  # more than a page of the list (100): "select all" takes the runs not shown too


def failed_runs(n: int) -> list[str]:
    """`n` runs of `scripted` refused at `first` three times, inserted at once."""
    now = timezone.now()
    fingerprint = get_workflow("scripted").fingerprint
    ids = [f"PO-2026-{i:04d}" for i in range(n)]
    RunState.objects.bulk_create(
        RunState(run_id=run_id, workflow="scripted", plan_fingerprint=fingerprint, input={"n": i},
                 status=RunStatus.FAILED, cursor=0, reason="first: refused by the carrier",
                 created_at=now - timedelta(seconds=i), updated_at=now)
        for i, run_id in enumerate(ids))
    RunStep.objects.bulk_create(
        RunStep(run_id=run_id, step="first", attempt=a, status=StepStatus.FAILED, error="carrier refused",
                effect_key=effect_key(run_id, "first"), started_at=now, finished_at=now)
        for run_id in ids for a in (1, 2, 3))
    return ids


def test_select_all_failed_runs_retry_them_in_bulk_and_watch_the_progress_page(
    live_server, browser: Browser  # noqa: F811  (the fixture imported above)
):
    ids = failed_runs(FAILED)
    staff("otto", *VIEW, "retry_run", "cancel_run")
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/durableruns/runstate/?status__exact=failed")
    expect(page).to_have_url(re.compile(r"/admin/login/"))
    page.fill("#id_username", "otto")
    page.fill("#id_password", "pw-otto-9f3")
    page.click("input[type=submit]")

    page.check("#action-toggle")  # the page's 100
    page.get_by_role("button", name=f"Select all {FAILED} runs").click()
    page.select_option("select[name=action]", "retry_runs")
    page.click("button[name=index]")  # Go
    expect(page.locator(".dr-bulk-count")).to_contain_text(f"{FAILED} matching the list's filters (status = failed)")
    page.fill("#id_note", "carrier is back (INC-2290)")
    page.get_by_role("button", name="Yes, retry failed runs in bulk").click()

    bulk = Bulk.objects.get()
    expect(page).to_have_url(re.compile(rf"/admin/durableruns/runstate/bulk/{bulk.bulk_id}/$"))
    expect(page.locator(".dr-bulk-state")).to_have_text("running")
    expect(page.locator(".dr-bulk-total")).to_have_text(str(FAILED))
    assert not Intervention.objects.exists()  # the request recorded the bulk and acted on nothing

    services.cancel_run(ids[7], by="someone", note="the buyer withdrew")  # it no longer fits: skipped
    bulks.drain()  # a worker's share, as resume_runs takes it
    expect(page.locator(".dr-bulk-state")).to_have_text("finished")  # the page reloaded itself
    expect(page.locator(".dr-bulk-done")).to_have_text(str(FAILED))
    skipped = page.locator(".dr-bulk-failed tbody tr")
    expect(skipped).to_have_count(1)
    expect(skipped.locator("td").nth(0)).to_have_text(ids[7])
    expect(skipped.locator("td").nth(1)).to_have_text("it no longer matches the bulk's filter")
    shoot(page, "bulk_progress.png")
    assert Intervention.objects.filter(bulk_id=bulk.bulk_id, action="retry", decided_by="otto").count() == FAILED - 1
    assert RunState.objects.filter(status=RunStatus.PENDING).count() == FAILED - 1
