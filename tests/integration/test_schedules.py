"""Schedules in-process on the real database: a slot's run starts once, catch-up after an outage, daylight
saving through the record, and a pass of resume_runs that starts and works what is due. The database's clock is
moved with Clock(shift=...), every statement of a look together."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import pytest

import durableruns
from durableruns import schedules, services
from durableruns.clock import Clock
from durableruns.models import RunState, RunStatus, ScheduleState

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def declared(monkeypatch):
    monkeypatch.setattr(schedules, "_declared", {})


def at(when: datetime) -> Clock:
    """The database's clock moved to `when` (and on from there)."""
    return Clock(shift=when - Clock().now())


BASE = datetime(2026, 6, 1, 9, 0, 10, tzinfo=UTC)  # ten seconds past a minute


def later(minutes: float) -> Clock:
    return Clock(shift=timedelta(minutes=minutes))


def runs(name: str) -> list[str]:
    return sorted(RunState.objects.filter(run_id__startswith=f"{name}@").values_list("run_id", flat=True))


def test_a_schedule_starts_nothing_before_a_worker_first_saw_it_then_each_slot_once():
    durableruns.schedule("sync", "ticked", "* * * * *")
    base = BASE
    assert schedules.start_due(clock=at(base)).started == ()  # first sight: recorded, nothing before it started
    assert ScheduleState.objects.get(pk="sync").last_slot is None
    tick = schedules.start_due(clock=at(base + timedelta(seconds=60)))
    assert tick.started == ("sync@2026-06-01T09:01:00Z",) and 49 < tick.next_in <= 50
    assert schedules.start_due(clock=at(base + timedelta(seconds=61))).started == ()  # the same slot again
    assert schedules.start_due(clock=at(base + timedelta(seconds=100))).started == ()
    assert schedules.start_due(clock=at(base + timedelta(seconds=115))).started == ("sync@2026-06-01T09:02:00Z",)
    assert runs("sync") == ["sync@2026-06-01T09:01:00Z", "sync@2026-06-01T09:02:00Z"]
    assert ScheduleState.objects.get(pk="sync").last_slot == datetime(2026, 6, 1, 9, 2, tzinfo=UTC)
    assert RunState.objects.get(pk=runs("sync")[0]).status == RunStatus.PENDING


def test_after_a_ten_minute_outage_latest_starts_one_run():
    durableruns.schedule("sync", "ticked", "* * * * *", catch_up="latest")
    schedules.start_due(clock=at(BASE))
    started = schedules.start_due(clock=at(BASE + timedelta(minutes=10))).started
    assert started == ("sync@2026-06-01T09:10:00Z",) and runs("sync") == list(started)  # the latest slot missed


def test_after_a_ten_minute_outage_all_starts_every_slot_once(caplog):
    durableruns.schedule("sync", "ticked", "* * * * *", catch_up="all", input={"kind": "sync"})
    schedules.start_due(clock=at(BASE))
    assert len(schedules.start_due(clock=at(BASE + timedelta(minutes=10))).started) == 10
    assert schedules.start_due(clock=at(BASE + timedelta(minutes=10, seconds=5))).started == ()
    assert runs("sync") == [f"sync@2026-06-01T09:{m:02d}:00Z" for m in range(1, 11)]
    assert len(runs("sync")) == 10 and RunState.objects.get(pk=runs("sync")[0]).input == {"kind": "sync"}
    assert "skipped" not in caplog.text


def test_catching_up_all_is_capped_and_says_what_it_skipped(settings, caplog):
    settings.DURABLERUNS_SCHEDULE_CATCH_UP_MAX = 3
    durableruns.schedule("sync", "ticked", "* * * * *", catch_up="all")
    schedules.start_due(clock=at(BASE))
    with caplog.at_level(logging.WARNING, logger="durableruns"):
        assert len(schedules.start_due(clock=at(BASE + timedelta(minutes=10))).started) == 3
    assert "starts 3 slot(s) missed" in caplog.text and "skipped" in caplog.text


@pytest.mark.parametrize(("night", "expected"), [
    (datetime(2026, 3, 28, 23, 0, tzinfo=UTC), "nightly@2026-03-29T01:00:00Z"),  # 02:30 skipped: 03:00 CEST
    (datetime(2026, 10, 24, 23, 0, tzinfo=UTC), "nightly@2026-10-25T00:30:00Z"),  # 02:30 twice: the first
], ids=["springs-forward", "falls-back"])
def test_a_nightly_slot_runs_once_on_the_nights_the_clock_changes(night, expected):
    durableruns.schedule("nightly", "ticked", "30 2 * * *", timezone="Europe/Berlin", catch_up="all")
    schedules.start_due(clock=at(night))
    for minutes in range(10, 6 * 60, 10):  # a worker looking every ten minutes through the night
        schedules.start_due(clock=at(night + timedelta(minutes=minutes)))
    assert runs("nightly") == [expected]


def test_a_pass_of_resume_runs_starts_the_due_slots_and_works_them():
    durableruns.schedule("sync", "ticked", "* * * * *", input={"kind": "sync"})
    services.resume_due()  # first sight
    report = services.resume_due(clock=later(3))
    assert report.counts() == {"completed": 1}
    (run_id,) = runs("sync")
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED


def test_a_slot_whose_run_exists_already_is_not_started_again():
    declared = durableruns.schedule("sync", "ticked", "* * * * *", catch_up="all")
    schedules.start_due(clock=at(BASE))
    durableruns.start("ticked", {}, run_id=declared.run_id(datetime(2026, 6, 1, 9, 1, tzinfo=UTC)))  # by hand
    started = schedules.start_due(clock=at(BASE + timedelta(minutes=3))).started
    assert started == ("sync@2026-06-01T09:02:00Z", "sync@2026-06-01T09:03:00Z")
    assert len(runs("sync")) == 3


def test_a_schedule_naming_an_undeclared_workflow_is_a_system_check_error_and_starts_nothing(caplog):
    from django.core import checks

    durableruns.schedule("orphan", "no_such_workflow", "* * * * *")
    errors = [m for m in checks.run_checks(tags=["durableruns"]) if m.id == "durableruns.E023"]
    assert len(errors) == 1 and "no_such_workflow" in errors[0].msg
    schedules.start_due(clock=at(BASE))
    assert schedules.start_due(clock=at(BASE + timedelta(minutes=2))).started == ()
    assert "not declared in this deploy" in caplog.text and runs("orphan") == []


# -- one schedule's trouble (issue 30, item 2) -------------------------------------------------------------------


def test_a_schedule_whose_input_the_workflow_refuses_is_a_check_error_and_skips_only_itself(caplog):
    from django.core import checks

    from durableruns.ops import health

    durableruns.schedule("bad", "keyed", "* * * * *", input={"seller": "x"})  # keyed reads input["buyer"]
    durableruns.schedule("good", "ticked", "* * * * *")
    errors = [m for m in checks.run_checks(tags=["durableruns"]) if m.id == "durableruns.E024"]
    assert len(errors) == 1 and "'bad'" in errors[0].msg and "KeyError" in errors[0].msg
    schedules.start_due(clock=at(BASE))
    with caplog.at_level(logging.ERROR, logger="durableruns"):
        tick = schedules.start_due(clock=at(BASE + timedelta(minutes=1)))  # raised KeyError before any claim
    assert tick.started == ("good@2026-06-01T09:01:00Z",) and runs("bad") == []
    assert [name for name, _ in tick.troubles] == ["bad"] and "concurrency_key" in tick.troubles[0][1]
    assert "schedule bad: slot 2026-06-01T09:01:00Z not started" in caplog.text
    (problem,) = [p for p in health.check().problems if p.check == "schedules"]
    assert problem.level is health.Level.CRITICAL and "bad:" in problem.message and "good" not in problem.message


def test_a_pass_of_resume_runs_works_its_runs_whatever_one_schedule_says():
    from io import StringIO

    from django.core.management import call_command

    durableruns.start("ticked", {}, run_id="unscheduled")
    durableruns.schedule("bad", "keyed", "* * * * *", input={})
    durableruns.schedule("good", "ticked", "* * * * *")
    schedules.start_due(clock=at(BASE))
    call_command("resume_runs", "--once", stdout=StringIO())  # exited 1 with a KeyError's traceback before
    assert RunState.objects.get(pk="unscheduled").status == RunStatus.COMPLETED


def test_a_timetable_whose_look_raises_is_started_again_and_counted(monkeypatch, caplog):
    from durableruns.worker.pool import Waker
    from durableruns.worker.timetable import Timetable

    looks = []

    def start_due(*, clock=None):
        looks.append(clock)
        if len(looks) == 1:
            raise RuntimeError("a bug in a look")
        return schedules.Tick(next_in=0.05)

    monkeypatch.setattr(schedules, "start_due", start_due)
    monkeypatch.setattr(Timetable, "RESTART_SECONDS", 0.05, raising=False)
    timetable = Timetable(Waker(), Clock()).start()
    try:
        deadline = time.monotonic() + 5
        while len(looks) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        timetable.stop()
    assert len(looks) >= 3 and timetable.restarts == 1  # it went on looking after the bug: it did not die
    assert "timetable: a look raised" in caplog.text and "RuntimeError: a bug in a look" in caplog.text
