"""The schedules page of the back office: each schedule with its declaration, last slot and next slot; read-only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import durableruns
from durableruns import schedules
from durableruns.clock import Clock
from tests.admin.users import logged_in, staff

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def declared(monkeypatch):
    monkeypatch.setattr(schedules, "_declared", {})


def at(when: datetime) -> Clock:
    return Clock(shift=when - Clock().now())


def test_the_schedules_page_lists_each_schedule_with_its_last_and_next_slot():
    durableruns.schedule("nightly_reconciliation", "ticked", "30 2 * * *", timezone="Europe/Berlin")
    durableruns.schedule("hourly_sync", "ticked", "0 * * * *", catch_up="all")
    night = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)
    schedules.start_due(clock=at(night))
    schedules.start_due(clock=at(night + timedelta(hours=3)))  # 02:30 is skipped that night: 03:00 CEST
    client = logged_in(staff("sched", "view_schedulestate", "view_runstate"))

    page = client.get("/admin/durableruns/schedulestate/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "nightly_reconciliation" in text and "30 2 * * *" in text and "Europe/Berlin" in text
    assert "2026-03-29T01:00:00Z" in text  # the last slot started (03:00 CEST)
    assert "2026-03-30T00:30:00Z" in text  # the next: 02:30 CEST the next night
    assert "hourly_sync" in text and "2026-03-29T02:00:00Z" in text and "2026-03-29T03:00:00Z" in text
    assert "Add schedule" not in text

    change = client.get("/admin/durableruns/schedulestate/nightly_reconciliation/change/")
    assert change.status_code == 200 and "runs of nightly_reconciliation" in change.content.decode()
    assert 'name="_save"' not in change.content.decode()  # read-only: nothing to save


def test_a_schedule_this_deploy_no_longer_declares_says_so():
    durableruns.schedule("gone", "ticked", "0 * * * *")
    schedules.start_due()
    schedules._declared.clear()
    client = logged_in(staff("sched", "view_schedulestate"))
    assert "not declared in this deploy" in client.get("/admin/durableruns/schedulestate/").content.decode()


def test_a_schedule_whose_input_its_workflow_refuses_says_why_no_slot_starts():
    durableruns.schedule("bad", "keyed", "* * * * *", input={"seller": "x"})
    durableruns.schedule("good", "ticked", "* * * * *")
    schedules.start_due()
    text = logged_in(staff("sched", "view_schedulestate")).get("/admin/durableruns/schedulestate/").content.decode()
    assert text.count("no slot starts:") == 1 and "concurrency_key cannot be read" in text
