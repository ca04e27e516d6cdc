"""Step rate limits (issue 35), on the real database: the turn in process on either database, and three `--loop`
worker processes on PostgreSQL, counted by the far system's own clock (the carrier's ledger records each booking's
time as it accepts it)."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest

import durableruns
from durableruns import conf, services, testing
from durableruns.clock import Clock
from durableruns.models import RateTurn, RunState, RunStatus, RunStep
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _resume(**kwargs):
    return services.resume_due(owner="t", **kwargs)


def test_a_run_over_the_limit_waits_for_its_computed_turn_holding_nothing():
    """rated_plain allows 2 a minute, one bucket: the third run waits, released with no lease, until the first
    start plus a minute and the margin (the database's clock), and says so in its reason and its boundary; a
    worker that comes before then starts nothing, one that comes after it starts it."""
    assert conf.rate_margin() == timedelta(seconds=0.1)
    runs = [durableruns.start("rated_plain", {"n": n}) for n in range(3)]
    _resume()
    statuses = dict(RunState.objects.filter(pk__in=runs).values_list("pk", "status"))
    assert [statuses[r] for r in runs] == [RunStatus.COMPLETED, RunStatus.COMPLETED, RunStatus.WAITING]
    third = RunState.objects.get(pk=runs[2])
    first_start = RateTurn.objects.get(run_id=runs[0]).at
    assert third.wake_at == first_start + timedelta(minutes=1) + conf.rate_margin()
    assert third.lease_expires_at is None
    assert third.reason == f"waiting for the rate limit of plain_call until {third.wake_at:%H:%M:%S}"
    assert not RunStep.objects.filter(run_id=runs[2]).exists()  # no attempt: nothing acted, nothing in doubt
    assert f"waiting for the rate limit of plain_call until {third.wake_at:%H:%M:%S}" in str(
        durableruns.boundary(runs[2]))
    # Not due before its turn: a claim now does not take it.
    _resume()
    assert RunState.objects.get(pk=runs[2]).status == RunStatus.WAITING
    # Its turn comes (the database's clock moved past it): it starts, under the turn it was given.
    _resume(clock=Clock(shift=timedelta(seconds=61)))
    assert RunState.objects.get(pk=runs[2]).status == RunStatus.COMPLETED
    turn = RateTurn.objects.get(run_id=runs[2])
    assert turn.started and turn.at >= third.wake_at


def test_a_key_asked_once_gives_each_key_its_own_window():
    """rated allows 5 a second per carrier: 7 runs of dhl and 7 of ups, one pass: 5 of each start, 2 of each wait,
    whose reasons name their key; each waiting run's turn is the start it waits behind plus a second."""
    runs = {c: [durableruns.start("rated", {"carrier": c}) for _ in range(7)] for c in ("dhl", "ups")}
    _resume()
    for carrier, ids in runs.items():
        statuses = [RunState.objects.get(pk=r).status for r in ids]
        assert statuses.count(RunStatus.COMPLETED) == 5 and statuses.count(RunStatus.WAITING) == 2, statuses
        starts = sorted(RateTurn.objects.filter(key=carrier, started=True).values_list("at", flat=True))
        waits = sorted(RateTurn.objects.filter(key=carrier, started=False).values_list("at", flat=True))
        second = timedelta(seconds=1) + conf.rate_margin()  # the window, and the margin for the far system's sake
        assert waits == [starts[0] + second, starts[1] + second]
        waiting = RunState.objects.filter(pk__in=ids, status=RunStatus.WAITING).first()
        assert f"waiting for the rate limit of book_rated (key {carrier}) until" in waiting.reason
    deadline = time.monotonic() + 10
    while RunState.objects.filter(status=RunStatus.WAITING).exists():  # their turns come within a second
        assert time.monotonic() < deadline, "the waiting runs' turns did not come"
        time.sleep(0.1)
        _resume()
    assert RunState.objects.filter(status=RunStatus.COMPLETED).count() == 14


def test_an_in_doubt_attempt_settled_by_its_lookup_takes_no_turn_and_a_re_execution_takes_one(far):
    """The booking's reply is lost after the carrier accepted it: its lookup finds it, and the step completes
    with one start recorded. Lost before the call: the lookup proves it absent, the step runs again, and that
    second attempt takes a second turn."""
    raised: list[str] = []

    def lose_reply(point: str, step: str) -> None:
        if step == "book_rated" and point == "after_effect" and not raised:
            raised.append(point)
            raise TimeoutError("reply lost")

    testing.arm(lose_reply)
    try:
        found = durableruns.start("rated", {"carrier": "dhl"})
        _resume()
    finally:
        testing.arm(None)
    assert RateTurn.objects.filter(run_id=found, started=True).count() == 1
    again = durableruns.start("rated", {"carrier": "dhl", "unanswered_first": True})
    _resume()  # in doubt: absence is provable once its call could have landed
    (first_turn,) = RateTurn.objects.filter(run_id=again, started=True).values_list("at", flat=True)
    _resume(clock=Clock(shift=timedelta(seconds=5)))  # (the first turn, out of the window then, is let go)
    assert raised and RunState.objects.get(pk=found).status == RunStatus.COMPLETED
    assert RunStep.objects.get(run_id=found, step="book_rated", attempt=1).resolution == "lookup"
    assert RunState.objects.get(pk=again).status == RunStatus.COMPLETED, RunState.objects.get(pk=again).reason
    assert RunStep.objects.filter(run_id=again, step="book_rated").count() == 2
    (second_turn,) = RateTurn.objects.filter(run_id=again, started=True).values_list("at", flat=True)
    assert second_turn > first_turn + timedelta(seconds=4)  # the re-execution's own turn
    assert len(far.carrier.effects(f"{found}:book_rated")) == 1 and len(far.carrier.effects(f"{again}:book_rated")) == 1


# -- three worker processes (PostgreSQL) ----------------------------------------------------------------------


def _bookings(far, runs: list[str]) -> list[float]:
    """The carrier's own times of the runs' bookings; each run booked exactly once."""
    times = []
    for run_id in runs:
        effects = far.carrier.effects(f"{run_id}:book_rated")
        assert len(effects) == 1, f"{run_id} booked {len(effects)} times"
        times.append(effects[0]["created_at"])
    return sorted(times)


def _most_in_a_window(times: list[float], window: float = 1.0) -> int:
    """The most of `times` inside any window [t, t + window): the busiest one starts at one of them."""
    return max(sum(1 for u in times if t <= u < t + window) for t in times)


# The workers' DURABLERUNS_RATE_MARGIN_SECONDS: the default (0.1 s) absorbs the variation of the time from a turn to
# its call on a quiet host; on a loaded 2-core machine that variation has passed 0.1 s (6 calls in one carrier
# second, seen), so the workers here count each start a little longer. The promise itself, on the database's
# clock, is asserted with no margin at all (_most_turns_in_a_window).
MARGIN = {"DURABLERUNS_RATE_MARGIN_SECONDS": "0.3"}


def _most_turns_in_a_window(runs: list[str]) -> int:
    """The most recorded starts of the runs' bookings (the database's clock) inside any 1 s window."""
    starts = sorted(at.timestamp() for at in RateTurn.objects.filter(run_id__in=runs, step="book_rated",
                                                                        started=True).values_list("at", flat=True))
    return _most_in_a_window(starts)


def _all_complete(runs: list[str], timeout: float) -> None:
    wait_until(lambda: RunState.objects.filter(pk__in=runs, status=RunStatus.COMPLETED).count() == len(runs),
               timeout=timeout, every=0.2, what=f"{len(runs)} runs to complete")


@pytest.mark.postgres
def test_three_workers_keep_five_a_second_by_the_carriers_clock(workers, far):
    """60 runs of rate 5/s, three `--loop` workers of 4 threads: no second of the carrier's clock holds more than
    5 bookings, every run completes, and none books twice. (How close it comes to the ideal 12 s: bench/rates.py.)"""
    runs = [durableruns.start("rated", {"carrier": "dhl"}) for _ in range(60)]
    for name in ("w1", "w2", "w3"):
        workers.start("--loop", "--concurrency", "4", "--interval", "0.5", "--worker", name, **MARGIN)
    _all_complete(runs, timeout=90)
    times = _bookings(far, runs)
    assert _most_in_a_window(times) == 5  # the limit was reached, never passed
    assert _most_turns_in_a_window(runs) <= 5
    assert times[-1] - times[0] >= 11  # 60 at 5 a second: the 56th cannot start before 11 s after the first


@pytest.mark.postgres
def test_a_worker_killed_mid_way_leaves_the_limit_kept_and_every_run_booked_once(workers, far):
    """The same with one of the three workers SIGKILLed after about a third of the bookings, while it has a
    booking in hand: that run is taken over once its lease runs out (a booking made is found by its lookup and
    completes, taking no second turn; one not made runs again, under a turn of its own), and the limit holds."""
    # Each booking held 0.2 s: the kill must land while w1 holds one, not just after the check that it does.
    runs = [durableruns.start("rated", {"carrier": "dhl", "hold": 0.2}) for _ in range(60)]
    procs = [workers.start("--loop", "--concurrency", "4", "--interval", "0.5", "--lease", "2", "--worker", name,
                           **MARGIN)
             for name in ("w1", "w2", "w3")]
    in_hand = RunStep.objects.filter(step="book_rated", status="started", owner__startswith="w1#")
    wait_until(lambda: far.carrier.count() >= 20 and in_hand.exists(), timeout=60, every=0.005,
               what="a third of the bookings, and one in w1's hands")
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    orphans = set(RunStep.objects.filter(step="book_rated", status="started", owner__startswith="w1#")
                  .values_list("run_id", flat=True))
    assert orphans
    _all_complete(runs, timeout=120)
    times = _bookings(far, runs)  # each run booked once, the orphans too
    assert _most_in_a_window(times) <= 5 and _most_turns_in_a_window(runs) <= 5
    settled = RunStep.objects.filter(run_id__in=orphans, step="book_rated", resolution="lookup").count()
    print(f"killed mid-way: {len(orphans)} booking(s) in w1's hands, {settled} settled by lookup")


@pytest.mark.postgres
def test_two_keys_progress_side_by_side(workers, far):
    """30 runs for dhl and 30 for ups, interleaved, at 5/s per carrier: each carrier's bookings keep their own
    limit, and the two run at once (10 a second together), not one after the other."""
    runs = {c: [] for c in ("dhl", "ups")}
    for _ in range(30):
        for carrier, ids in runs.items():
            ids.append(durableruns.start("rated", {"carrier": carrier}))
    for name in ("w1", "w2", "w3"):
        workers.start("--loop", "--concurrency", "4", "--interval", "0.5", "--worker", name, **MARGIN)
    _all_complete(runs["dhl"] + runs["ups"], timeout=90)
    times = {carrier: _bookings(far, ids) for carrier, ids in runs.items()}
    for carrier, booked in times.items():
        assert _most_in_a_window(booked) == 5, carrier
        assert _most_turns_in_a_window(runs[carrier]) <= 5, carrier
    assert _most_in_a_window(sorted(times["dhl"] + times["ups"])) > 5  # side by side
    # Each carrier's span overlaps the other's nearly whole: neither waited for the other to finish.
    overlap = min(times["dhl"][-1], times["ups"][-1]) - max(times["dhl"][0], times["ups"][0])
    assert overlap > 0.8 * min(times["dhl"][-1] - times["dhl"][0], times["ups"][-1] - times["ups"][0])
