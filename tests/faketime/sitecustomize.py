"""Loaded as `sitecustomize` only by the processes the tests run under libfaketime (tests.conftest.Workers.skewed).

libfaketime 0.9.10 with the monotonic clock left true (FAKETIME_DONT_FAKE_MONOTONIC=1, so that durations and
thread timeouts stay right) makes every time.sleep fail with EINVAL: Python sleeps with
clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), and libfaketime's wrapper of it mistranslates the absolute
deadline. A real host whose clock is wrong sleeps fine, so a skewed process here sleeps on a lock's timeout instead
(sem_clockwait on the true monotonic clock, which libfaketime leaves alone): same durations, same signal handling.
"""

from __future__ import annotations

import threading
import time

_never_released = threading.Lock()
_never_released.acquire()


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    _never_released.acquire(timeout=seconds)  # nobody releases it: this waits out the timeout


time.sleep = _sleep
