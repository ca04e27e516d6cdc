"""The test clock and drive() (issue 35, durableruns.testing): time that every durableruns decision reads moves
on by `advance()`, in this process and in the worker processes a test starts under it, without touching the
system clock; drive() works what is due in process. Nothing here sleeps past a second."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

import durableruns
from durableruns import schedules, testing
from durableruns.clock import Clock, moved
from durableruns.models import RunState, RunStatus, RunStep
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def status(run_id: str) -> str:
    return RunState.objects.get(pk=run_id).status


def test_the_demos_two_day_approval_timeout_escalates_after_advancing_two_days(far, clock):
    """The example of docs/howto/testing.md, as it is written there: the full purchase order above the approval
    limit waits for its manager; two days later by the test clock (in well under a second) it is escalated."""
    began = time.monotonic()
    run_id = durableruns.start("full_purchase_order", {"reference": "PO-41", "buyer": "Quay Bakery", "line_count": 240})
    testing.drive()
    assert durableruns.boundary(run_id).waiting == {"manager_approval": "approval"}
    clock.advance(timedelta(days=2))
    did = testing.drive()
    assert [(o.run_id, o.status) for o in did] == [(run_id, RunStatus.NEEDS_DECISION)]
    assert "manager_approval" in RunState.objects.get(pk=run_id).reason
    assert far.payments.count() == 0  # nothing charged while it waited
    assert time.monotonic() - began < 5  # two days of the run's time, not of the test's
    # Decided late, it goes on: charged, placed, and waiting for the supplier's confirmation (2 days more).
    durableruns.decide(run_id, "manager_approval", "approve", by="ann", note="sorry, late")
    testing.drive()
    assert durableruns.boundary(run_id).waiting == {"supplier_confirmed": "wait_for"}
    assert far.payments.count() == 1
    # The supplier's confirmation (a wait_for with a 2-day timeout) does not come: escalated two days on.
    clock.advance(timedelta(days=1))
    assert not testing.drive()
    clock.advance(timedelta(days=1, seconds=1))
    assert [o.status for o in testing.drive()] == [RunStatus.NEEDS_DECISION]
    assert "supplier_confirmed" in RunState.objects.get(pk=run_id).reason


def test_a_one_day_advance_is_not_two(far):
    """The context manager: one day is not enough for the 2-day timeout, and leaving the clock moves time back."""
    run_id = durableruns.start("full_purchase_order", {"reference": "PO-42", "buyer": "Quay Bakery", "line_count": 240})
    with testing.clock() as moving:
        testing.drive()
        before = Clock().now()
        now = moving.advance(days=1)
        assert timedelta(days=1) <= now - before < timedelta(days=1, seconds=5)
        assert not testing.drive()  # not due yet: the approval waits until its 2 days are up
        assert status(run_id) == RunStatus.WAITING
    assert moved() == timedelta(0)
    assert abs(Clock().now() - datetime.now(UTC)) < timedelta(minutes=1)
    with pytest.raises(ValueError, match="forward"):
        testing.TestClock().advance(timedelta(seconds=-1))


def test_a_rate_window_refills_after_advancing_past_it(clock):
    """rated_plain allows 2 a minute: the third run waits for its turn until the clock passes the window."""
    runs = [durableruns.start("rated_plain", {"n": n}) for n in range(3)]
    testing.drive()
    assert [status(r) for r in runs] == [RunStatus.COMPLETED, RunStatus.COMPLETED, RunStatus.WAITING]
    clock.advance(timedelta(seconds=30))
    assert not testing.drive()
    clock.advance(timedelta(seconds=31))
    testing.drive(runs[2])
    assert status(runs[2]) == RunStatus.COMPLETED


def test_a_schedules_next_slot_starts_after_advancing_past_it(clock, monkeypatch):
    monkeypatch.setattr(schedules, "_declared", {})
    durableruns.schedule("hourly_check", "ticked", "0 * * * *")
    testing.drive()  # first sight: recorded, nothing before it started
    assert not RunState.objects.filter(run_id__startswith="hourly_check@").exists()
    clock.advance(timedelta(hours=1))
    did = testing.drive()
    (slot,) = RunState.objects.filter(run_id__startswith="hourly_check@").values_list("run_id", flat=True)
    assert status(slot) == RunStatus.COMPLETED and slot in {o.run_id for o in did}


def test_a_lease_runs_out_by_the_moved_clock():
    """A run taken by a worker that then vanished (its lease 30 s): not taken over before, taken over once the
    clock passes the lease."""
    from durableruns import store

    run_id = durableruns.start("ticked", {})
    assert store.claim(owner="lost", lease_seconds=30) is not None
    with testing.clock() as moving:
        assert not testing.drive()
        moving.advance(seconds=31)
        assert [o.run_id for o in testing.drive()] == [run_id]
    assert status(run_id) == RunStatus.COMPLETED


@pytest.mark.postgres
def test_a_worker_started_under_the_clock_sees_its_moves(workers, clock):
    """A `--loop` worker started after the clock: a run asleep for an hour wakes as soon as the test moves the
    clock by an hour (the worker reads the move from the clock's file within a beat), not an hour later."""
    run_id = durableruns.start("sleeper", {"seconds": 3600})
    workers.start("--loop", "--concurrency", "1", "--interval", "5")
    wait_until(lambda: RunStep.objects.filter(run_id=run_id, step="nap").exists(), timeout=20, what="the nap")
    assert status(run_id) == RunStatus.WAITING
    clock.advance(timedelta(hours=1))
    began = time.monotonic()
    wait_until(lambda: status(run_id) == RunStatus.COMPLETED, timeout=10, every=0.02, what="the worker to wake it")
    assert time.monotonic() - began < 2
