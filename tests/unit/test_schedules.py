"""Schedules' slots, pure: which slots a look starts, catch-up after an outage, and daylight saving."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from durableruns import schedules
from durableruns.errors import DeclarationError
from durableruns.schedules import Schedule, due, slot_text, slots_between

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_schedules(monkeypatch):
    monkeypatch.setattr(schedules, "_declared", {})


def test_slots_between_counts_after_exclusive_and_until_inclusive():
    slots, more = slots_between("* * * * *", ZoneInfo("UTC"), utc(2026, 5, 1, 10, 0), utc(2026, 5, 1, 10, 3),
                                limit=10)
    assert slots == [utc(2026, 5, 1, 10, 1), utc(2026, 5, 1, 10, 2), utc(2026, 5, 1, 10, 3)] and not more
    slots, _ = slots_between("* * * * *", ZoneInfo("UTC"), utc(2026, 5, 1, 10, 0), utc(2026, 5, 1, 10, 0, 59),
                             limit=10)
    assert slots == []


@pytest.mark.parametrize(("catch_up", "expected", "left_out"), [
    ("latest", [utc(2026, 5, 1, 10, 10)], True),
    ("all", [utc(2026, 5, 1, 10, m) for m in range(1, 11)], False),
])
def test_a_ten_minute_outage_starts_the_latest_slot_or_every_slot(catch_up, expected, left_out):
    declared = Schedule(name="sync", workflow="w", cron="* * * * *", catch_up=catch_up)
    slots, more = due(declared, after=utc(2026, 5, 1, 10, 0), now=utc(2026, 5, 1, 10, 10, 30), cap=100)
    assert slots == expected and more is left_out


def test_catching_up_every_slot_is_capped_to_the_latest_ones():
    declared = Schedule(name="sync", workflow="w", cron="* * * * *", catch_up="all")
    slots, more = due(declared, after=utc(2026, 5, 1, 0, 0), now=utc(2026, 5, 3, 0, 0), cap=3)
    assert slots == [utc(2026, 5, 2, 23, 58), utc(2026, 5, 2, 23, 59), utc(2026, 5, 3, 0, 0)] and more


def test_a_slot_the_clock_skips_runs_once_when_the_clock_springs_forward():
    # Europe/Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that night.
    nightly = Schedule(name="nightly", workflow="w", cron="30 2 * * *", timezone="Europe/Berlin", catch_up="all")
    slots, _ = due(nightly, after=utc(2026, 3, 27, 12), now=utc(2026, 3, 31, 12), cap=100)
    assert [s.astimezone(BERLIN).strftime("%m-%d %H:%M %Z") for s in slots] == [
        "03-28 02:30 CET", "03-29 03:00 CEST", "03-30 02:30 CEST", "03-31 02:30 CEST"]
    # Looked at every five minutes through that night, the skipped slot still starts exactly once.
    starts = []
    after, now = utc(2026, 3, 28, 23, 0), utc(2026, 3, 28, 23, 0)
    while now < utc(2026, 3, 29, 4, 0):
        now += timedelta(minutes=5)
        found, _ = due(nightly, after=after, now=now, cap=100)
        starts += found
        after = found[-1] if found else after
    assert starts == [utc(2026, 3, 29, 1, 0)]


def test_a_slot_in_the_hour_that_repeats_runs_once_when_the_clock_falls_back():
    # Europe/Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice (00:30 and 01:30 UTC).
    nightly = Schedule(name="nightly", workflow="w", cron="30 2 * * *", timezone="Europe/Berlin", catch_up="all")
    slots, _ = due(nightly, after=utc(2026, 10, 24, 12), now=utc(2026, 10, 26, 12), cap=100)
    assert slots == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    # Looked at through the night (each look starting after the last slot started), still once.
    starts = []
    after, now = utc(2026, 10, 24, 23, 0), utc(2026, 10, 24, 23, 0)
    while now < utc(2026, 10, 25, 4, 0):
        now += timedelta(minutes=5)
        found, _ = due(nightly, after=after, now=now, cap=100)
        starts += found
        after = found[-1] if found else after
    assert starts == [utc(2026, 10, 25, 0, 30)]


def test_every_half_hour_keeps_each_real_half_hour_across_both_changes():
    # Not a fixed time of day: every half hour that really happens, no more, no less.
    half = Schedule(name="half", workflow="w", cron="*/30 * * * *", timezone="Europe/Berlin", catch_up="all")
    spring, _ = due(half, after=utc(2026, 3, 28, 23, 59), now=utc(2026, 3, 29, 3, 0), cap=100)
    autumn, _ = due(half, after=utc(2026, 10, 24, 22, 59), now=utc(2026, 10, 25, 2, 0), cap=100)
    assert len(spring) == 7 and len(autumn) == 7  # 3 h and 3 h of real time, two slots an hour, both ends in


def test_slot_text_and_run_id_are_iso_8601_utc():
    nightly = Schedule(name="nightly", workflow="w", cron="30 2 * * *", timezone="Europe/Berlin")
    slot = datetime(2026, 3, 29, 3, 0, tzinfo=BERLIN)
    assert slot_text(slot) == "2026-03-29T01:00:00Z"
    assert nightly.run_id(slot) == "nightly@2026-03-29T01:00:00Z"
    assert nightly.next_slot(utc(2026, 3, 28, 12)) == utc(2026, 3, 29, 1, 0)


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (("nightly", "w", "61 * * * *"), {}, "not valid"),
    (("nightly", "w", "* * *"), {}, "not valid"),
    (("nightly", "w", "* * * * *"), {"timezone": "Mars/Olympus"}, "time zone"),
    (("nightly", "w", "* * * * *"), {"catch_up": "some"}, "catch_up"),
    (("night@ly", "w", "* * * * *"), {}, "name"),
    (("nightly", 42, "* * * * *"), {}, "workflow"),
    (("nightly", "w", "* * * * *"), {"input": {"when": object()}}, "not JSON"),
])
def test_a_declaration_that_cannot_work_is_refused_at_once(args, kwargs, message):
    with pytest.raises(DeclarationError, match=message):
        schedules.schedule(*args, **kwargs)
    assert schedules.schedules() == ()


def test_declaring_takes_a_workflow_or_its_name():
    from durableruns import schedule
    from tests.workflows import mapping

    declared = schedule("nightly", mapping, "0 3 * * *", input={"a": 1}, timezone="Europe/Berlin", catch_up="all")
    assert declared.workflow == "mapping" and declared.input == {"a": 1}
    assert schedule("hourly", "mapping", "0 * * * *").workflow == "mapping"
    assert [s.name for s in schedules.schedules()] == ["hourly", "nightly"]
