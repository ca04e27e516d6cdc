"""What your tests use: a worker killed at a named point of a step's cycle (durableruns.faults), a clock that
skips days, and `drive()`, which works the due runs in the test's own process.

    def test_an_overdue_approval_escalates(clock):              # the pytest fixture (durableruns' pytest plugin)
        run_id = durableruns.start("full_purchase_order", {...})
        drive()                                                  # waits for its manager_approval
        clock.advance(timedelta(days=2))                         # its 2-day timeout passes
        drive()                                                  # escalated: needs a decision

    with durableruns.testing.clock() as clock:                   # the same, as a context manager
        ...

`clock.advance(delta)` moves the time every durableruns decision reads (leases, wake times, timeouts, due dates,
deadlines, rate windows, schedules' slots) by `delta`: every statement adds the move to the database's now(),
as `Clock(shift=)` does (durableruns.clock), so the record's times stay one clock's. The system clock is not
touched. Worker processes the test starts while the clock is in use (resume_runs in a subprocess) inherit the
file the clock writes its move to (DURABLERUNS_TEST_CLOCK) and read it again whenever it changes; their idle
threads look again within 0.2 s, so a move reaches them within a beat.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from durableruns.clock import TEST_CLOCK_VARIABLE, Clock, move_by, moved
from durableruns.faults import POINTS, Hook, arm, arm_from_environment, armed, kill_at, reached

if TYPE_CHECKING:
    from durableruns.passes import RunOutcome

__all__ = [
    "POINTS",
    "Hook",
    "TestClock",
    "arm",
    "arm_from_environment",
    "armed",
    "clock",
    "drive",
    "kill_at",
    "reached",
]


class TestClock:
    """A clock a test moves forward (`advance`) for this process and the worker processes it starts after entering
    it. Leaving it moves every clock back by what it moved them."""

    __test__ = False  # not a test class, whatever pytest makes of its name

    def __init__(self) -> None:
        self.moved = timedelta(0)  # how far this clock has moved time
        self._file: Path | None = None
        self._variable: str | None = None

    def __enter__(self) -> TestClock:
        if self._file is not None:
            raise RuntimeError("this test clock is in use already")
        handle, name = tempfile.mkstemp(prefix="durableruns-clock-", suffix=".us")
        os.close(handle)
        self._file = Path(name)
        self._write()
        self._variable = os.environ.get(TEST_CLOCK_VARIABLE)
        os.environ[TEST_CLOCK_VARIABLE] = name  # for the worker processes started from now on
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        move_by(-self.moved)
        self.moved = timedelta(0)
        if self._variable is None:
            os.environ.pop(TEST_CLOCK_VARIABLE, None)
        else:
            os.environ[TEST_CLOCK_VARIABLE] = self._variable
        if self._file is not None:
            self._file.unlink(missing_ok=True)
            self._file = None

    def advance(self, delta: timedelta | None = None, /, **parts: float) -> datetime:
        """Move the time by `delta` (or timedelta(**parts): `advance(days=2)`), here and in the workers started
        under this clock; return the database's time now, as moved."""
        if delta is None:
            delta = timedelta(**parts)
        elif parts:
            raise TypeError("advance() takes a timedelta or its parts (days=, hours=, ...), not both")
        if not isinstance(delta, timedelta) or delta < timedelta(0):
            raise ValueError(f"a test clock moves forward only: advance() takes a timedelta >= 0, not {delta!r}")
        move_by(delta)
        self.moved += delta
        self._write()
        return self.now()

    def now(self) -> datetime:
        """The database's time as every durableruns decision now reads it."""
        return Clock().now()

    def _write(self) -> None:
        """Write the move for the workers: a file replaced whole, so a worker never reads half a number."""
        if self._file is None:
            return
        fresh = self._file.with_name(self._file.name + ".new")
        fresh.write_text(str(moved() // timedelta(microseconds=1)), encoding="ascii")
        os.replace(fresh, self._file)


def clock() -> TestClock:
    """A test clock, to use as a context manager (`with clock() as c: c.advance(days=2)`); the pytest fixture of
    the same name (durableruns' pytest plugin) enters one for the test."""
    return TestClock()


def drive(run_id: str | None = None) -> list[RunOutcome]:
    """Work the due runs (only `run_id`, if given) in this process until none is due, starting the schedules'
    slots that have come; return what each pass over a run did (its run_id, status afterwards, a line saying
    what happened), in order. A run that waits (for a time, an event, a person) is left waiting: move a test
    clock past its time, send the event or decide, and drive again."""
    from durableruns import services  # the use cases sit above the worker, which imports the faults beside this

    outcomes: list[RunOutcome] = []
    for _ in range(100):  # each pass works until nothing is due; another only for what came due meanwhile
        report = services.resume_due(run_id=run_id)
        outcomes.extend(report.outcomes)
        if not report.outcomes:
            break
    return outcomes
