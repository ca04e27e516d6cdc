"""The waker idle worker threads wait on: a wake is one permit, taken by one wait, never lost and never multiplied.

No database: threads and a condition only. A permit left while no thread waited ends the next wait at once (a run
started while every thread was looking is not missed); many wakes then still send one thread, not one per wake
(a burst of notifications while the threads were busy does not buy a claim each); and wakes while several
threads wait rouse as many of them. And what the process knows between claims: nothing is due only while
notifications reach it and none has come since a claim that saw nothing else due began.
"""

from __future__ import annotations

import threading
import time

import pytest

from durableruns.worker.pool import HELD_RECHECK_SECONDS, PAST_DUE_SECONDS, Waker, idle_timeout


def test_a_wake_while_nobody_waits_ends_the_next_wait_at_once_and_only_that_one():
    waker = Waker()
    waker.wake()
    began = time.monotonic()
    assert waker.wait(5.0) is True
    assert time.monotonic() - began < 1.0
    assert waker.wait(0.05) is False  # the permit was taken: the next wait runs its course


def test_many_wakes_while_nobody_waits_leave_one_permit():
    waker = Waker()
    for _ in range(50):
        waker.wake()
    assert waker.wait(0.05) is True
    assert waker.wait(0.05) is False


def three_waiting(waker: Waker, timeout: float) -> tuple[list[threading.Thread], list[bool]]:
    """Three threads waiting on `waker` (each appends what its wait returned), once all three wait."""
    woken: list[bool] = []
    threads = [threading.Thread(target=lambda: woken.append(waker.wait(timeout)), daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while waker._waiting < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    return threads, woken


def test_wakes_while_threads_wait_rouse_one_thread_each():
    waker = Waker()
    threads, woken = three_waiting(waker, 5.0)
    waker.wake()
    waker.wake()
    time.sleep(0.2)
    assert woken == [True, True]  # two wakes, two threads; the third still waits
    waker.wake()
    for thread in threads:
        thread.join(5)
    assert woken == [True, True, True]


def test_wake_all_ends_every_wait_without_a_permit():
    waker = Waker()
    threads, woken = three_waiting(waker, 60.0)  # far longer than the joins below allow: only a wake ends them
    waker.wake_all()
    for thread in threads:
        thread.join(10)
    assert woken == [False, False, False] and not any(thread.is_alive() for thread in threads)


def test_nothing_is_known_to_be_due_only_while_hearing_with_no_wake_since_a_quiet_claim():
    waker = Waker()
    waker.saw_nothing_due(waker.wakes(), next_due=(time.monotonic(), None))
    assert waker.nothing_due() == (False, None)  # not hearing notifications: a run may be due unannounced
    waker.hearing = True
    assert waker.nothing_due() == (True, None)
    began = waker.wakes()
    waker.wake()  # something came due after that claim began: whoever takes the permit claims it
    assert waker.nothing_due() == (False, None)
    waker.saw_nothing_due(began)  # a claim begun before the wake does not cover it
    assert waker.nothing_due() == (False, None)
    waker.saw_nothing_due(waker.wakes())  # one begun after it, that took a run and saw nothing else due
    assert waker.nothing_due() == (True, None)
    waker.hearing = False
    assert waker.nothing_due() == (False, None)


def test_a_wake_time_read_by_a_quiet_claim_bounds_the_idle_wait_and_ends_the_knowledge_once_it_comes():
    waker = Waker()
    waker.hearing = True
    assert waker.nothing_due() == (False, None)  # no claim has read when the next run comes due
    waker.saw_nothing_due(waker.wakes(), next_due=(time.monotonic() - 2.0, 5.0))
    known, left = waker.nothing_due()
    assert known and left is not None and 2.9 < left <= 3.0
    waker.saw_nothing_due(waker.wakes(), next_due=(time.monotonic() - 10.0, 1.0))  # an older reading: kept out
    assert waker.nothing_due()[0]
    waker.saw_nothing_due(waker.wakes(), next_due=(time.monotonic() - 1.0, 0.5))  # due already: claim instead
    assert waker.nothing_due() == (False, None)


@pytest.mark.parametrize(
    ("due_in", "deadline_in", "expected"),
    [
        (None, None, 5.0),  # nothing comes due by itself: the poll interval
        (30.0, None, 5.0),  # later than the poll: the poll first
        (1.0, None, 1.0 + PAST_DUE_SECONDS),
        (0.01, None, 0.01 + PAST_DUE_SECONDS),  # however soon: a sleep ending in 10 ms is met in 10 ms, not later
        (0.0, None, HELD_RECHECK_SECONDS + PAST_DUE_SECONDS),  # due already, so held elsewhere: not spun on
        (-3.0, None, HELD_RECHECK_SECONDS + PAST_DUE_SECONDS),
        (1.0, 0.5, 0.5),  # never past the deadline
        (None, -1.0, 0.0),
    ],
)
def test_an_idle_wait_ends_just_after_the_next_wake_time_however_soon(due_in, deadline_in, expected):
    assert idle_timeout(due_in, poll=5.0, deadline_in=deadline_in) == pytest.approx(expected)


def test_a_claim_under_way_that_began_after_the_last_wake_answers_it_for_a_thread_that_ends_a_run():
    """While another thread's claim begun after the last wake is under way, a thread that ends a run knows nothing
    else needs a claim now: that claim sees what the wake announced (and wakes the next thread if more is due).
    A claim begun before the wake does not answer it, and once the claim is over only what it saw counts."""
    waker = Waker()
    waker.hearing = True
    waker.saw_nothing_due(waker.wakes(), next_due=(time.monotonic(), None))
    waker.wake()
    assert waker.nothing_due() == (False, None)
    looking = waker.claim_begins()
    assert waker.nothing_due() == (True, None)
    waker.wake()  # a second run announced while that claim was under way: it may not see it
    assert waker.nothing_due() == (False, None)
    later = waker.claim_begins()
    assert waker.nothing_due() == (True, None)
    waker.claim_ended(later)  # over, and it told nothing: it took a run with more due behind (that wakes anew)
    assert waker.nothing_due() == (False, None)
    waker.claim_ended(looking)
    assert waker.nothing_due() == (False, None)
    twice = [waker.claim_begins(), waker.claim_begins()]
    waker.claim_ended(twice[0])
    assert waker.nothing_due() == (True, None)  # the other one is still under way
    waker.claim_ended(twice[1])
    assert waker.nothing_due() == (False, None)


def test_a_claim_that_saw_more_due_wakes_the_next_thread_unless_a_wake_came_since_it_began():
    """A wake since the claim began already sends a thread to claim after it, which sees what that claim saw due:
    a second wake for the same run would send a thread to find nothing."""
    waker = Waker()
    began = waker.wakes()
    waker.wake_unless_since(began)
    assert waker.wait(0.05) is True  # no wake since: this one sends the next thread
    began = waker.wakes()
    waker.wake()  # a notification while the claim was under way
    waker.wake_unless_since(began)
    assert waker.wait(0.05) is True and waker.wait(0.05) is False  # one thread, not two
    threads, woken = three_waiting(waker, 5.0)
    began = waker.wakes()
    waker.wake()
    waker.wake_unless_since(began)
    time.sleep(0.2)
    assert woken == [True]  # one of the three waiting threads, not two
    waker.wake_all()
    for thread in threads:
        thread.join(5)
