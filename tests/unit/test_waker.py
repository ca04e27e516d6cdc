"""The waker idle worker threads wait on: a wake is one permit, taken by one wait, never lost and never multiplied.

No database: threads and a condition only. A permit left while no thread waited ends the next wait at once (a run
started while every thread was looking is not missed); many wakes then still send one thread, not one per wake
(a burst of notifications while the threads were busy does not buy a claim each); and wakes while several
threads wait rouse as many of them.
"""

from __future__ import annotations

import threading
import time

from durableruns.worker.pool import Waker


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
