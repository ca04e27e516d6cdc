"""A --loop worker's timetable: a thread that wakes when the next slot of a schedule comes and starts its run.

The slot's moment comes from the database's clock (durableruns.schedules.start_due says how many seconds away
it is, as the database read it); the thread waits that long on this process's monotonic clock, a duration
inside one process, and looks again. The runs it starts notify the listening workers on commit; it also wakes
this process's idle threads itself, so a worker that polls (SQLite, or a lost listener) picks them up at once.

One schedule's trouble skips that schedule (start_due). Should a look raise anything else (a bug), the thread is
not left dead: the error is logged with its traceback, counted (`restarts`, in the pass's summary), and the
timetable starts again after RESTART_SECONDS; nothing stops starting slots without saying so.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connections

from durableruns import schedules
from durableruns.clock import Clock, idle_poll_seconds
from durableruns.worker.background import Background
from durableruns.worker.pool import Waker

log = logging.getLogger("durableruns")


class Timetable(Background):
    """Start each schedule's slot as it comes, for as long as the worker runs."""

    thread_name = "durableruns-timetable"
    LONGEST_WAIT = 60.0  # looks again at least this often: a schedule declared later, a clock that moved
    RETRY_SECONDS = 1.0  # after the database could not be reached
    RESTART_SECONDS = 5.0  # after a look raised something unforeseen: not a hot loop of tracebacks

    def __init__(self, waker: Waker, clock: Clock) -> None:
        super().__init__()
        self.waker = waker
        self.clock = clock
        self.started = 0
        self.restarts = 0  # how often a look raised and the timetable was started again

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                try:
                    self._look_until_stopped()
                except Exception:  # a bug: a dead timetable would start no slot again, and say nothing
                    self.restarts += 1
                    log.exception(
                        "timetable: a look raised; it starts again in %gs (restart %d of this process)",
                        self.RESTART_SECONDS,
                        self.restarts,
                    )
                    connections.close_all()
                    self._stopped.wait(self.RESTART_SECONDS)
        finally:
            connections.close_all()  # this thread's own connection

    def _look_until_stopped(self) -> None:
        while not self._stopped.is_set():
            try:
                tick = schedules.start_due(clock=self.clock)
            except DatabaseError as exc:  # the pool meets it too; the next look starts what is due then
                log.warning("timetable: %s", str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
                self._stopped.wait(self.RETRY_SECONDS)
                continue
            for _ in tick.started:
                self.waker.wake()
            self.started += len(tick.started)
            wait = min(self.LONGEST_WAIT, idle_poll_seconds())  # a test clock's move is seen within a beat
            wait = wait if tick.next_in is None else min(wait, tick.next_in)
            self._stopped.wait(max(wait, 0.0) + 0.005)  # just past the slot: it is due by then
