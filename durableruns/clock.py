"""The one clock that decides ownership and proof of absence: the database server's.

Several cron hosts run workers against one database, and their own clocks differ. A lease's expiry, an attempt's
start, finish and last renewal, a wake time, and the moment a lookup's "not found" may be trusted are therefore
taken from the database in the statement that records or compares them (PostgreSQL's `now()`); no host's clock
is ever compared with another's. On SQLite the database runs inside the one host, so that host's clock is the
database's. A host's own clock only measures durations inside one process (`time.monotonic()`).

`Clock(shift=...)` moves the database's clock forward for tests (past a lookup's lag, a backoff), uniformly in
every statement and comparison, so two clocks are never mixed. A test clock (durableruns.testing.clock) moves
every clock of the process, and of the worker processes it starts, by as much again: its move is read by each
Clock's `shift` (`moved()`), in this process from memory, in a worker from the file DURABLERUNS_TEST_CLOCK names
(set by the test clock before it starts them). Outside tests the move is zero and nothing is read.
"""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now
from django.utils import timezone

from durableruns import conf


def on_postgresql() -> bool:
    """Whether the runs' database (DURABLERUNS_DATABASE) is PostgreSQL."""
    return connections[conf.database()].vendor == "postgresql"


# The environment variable naming the file a test clock writes its move to, for the worker processes it starts.
TEST_CLOCK_VARIABLE = "DURABLERUNS_TEST_CLOCK"
# How often an idle worker looks again while a test clock may move (its moves must be seen within a beat).
TEST_CLOCK_POLL_SECONDS = 0.2

_moved = timedelta(0)  # this process's test clock move (durableruns.testing.clock)
_moved_file = os.environ.get(TEST_CLOCK_VARIABLE) or None  # a worker started under a test clock reads its moves
_read: tuple[tuple[int, int], timedelta] | None = None  # the file's (inode, mtime) last read, and its move


def moved() -> timedelta:
    """How far a test clock has moved every clock of this process (zero outside tests)."""
    if _moved_file is None:
        return _moved
    return _moved + _file_move(_moved_file)


def _file_move(path: str) -> timedelta:
    global _read
    try:
        stat = os.stat(path)
    except OSError:
        return timedelta(0)  # the test clock was put away
    seen = (stat.st_ino, stat.st_mtime_ns)
    if _read is None or _read[0] != seen:
        try:
            with open(path, encoding="ascii") as file:
                move = timedelta(microseconds=int(file.read().strip() or 0))
        except (OSError, ValueError):
            return _read[1] if _read is not None else timedelta(0)  # written at this instant: the last move
        _read = (seen, move)
    return _read[1]


def move_by(delta: timedelta) -> timedelta:
    """Move every clock of this process by `delta` more (a test clock's advance); return the total move."""
    global _moved
    _moved += delta
    return _moved


def idle_poll_seconds() -> float:
    """The longest an idle worker waits before looking again: unbounded, but a beat while a test clock may move
    (a worker started under one, or a process whose clock was moved)."""
    return TEST_CLOCK_POLL_SECONDS if _moved_file is not None or _moved else math.inf


class Clock:
    """The database's clock, moved by `shift`: the clock's own (zero outside tests), plus a test clock's move."""

    __slots__ = ("own",)

    def __init__(self, shift: timedelta = timedelta(0)) -> None:
        self.own = shift

    @property
    def shift(self) -> timedelta:
        """What every statement adds to the database's now(): the clock's own shift and a test clock's move."""
        return self.own + moved()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Clock) and other.own == self.own

    def __hash__(self) -> int:
        return hash(self.own)

    def __repr__(self) -> str:
        return f"Clock(shift={self.own!r})"

    def now(self) -> datetime:
        """The database's time now (one round trip on PostgreSQL), as Django represents datetimes."""
        if not on_postgresql():
            return timezone.now() + self.shift
        shift: list[Any] = [self.shift]  # an interval: psycopg adapts it, whatever the stubs list
        with connections[conf.database()].cursor() as cursor:
            cursor.execute("SELECT clock_timestamp() + %s", shift)
            (value,) = cursor.fetchone()
        return as_django(value)

    def expression(self, after: timedelta = timedelta(0)) -> Any:
        """The database's time `after` from now, to write in an ORM statement: evaluated by the statement itself
        on PostgreSQL; on SQLite, this host's clock (the database's)."""
        if not on_postgresql():
            return timezone.now() + self.shift + after
        total = self.shift + after
        if not total:
            return Now()
        return ExpressionWrapper(Now() + Value(total), output_field=DateTimeField())


def as_django(value: datetime) -> datetime:
    """A datetime read with raw SQL, in the form Django's ORM gives (aware in UTC, or naive when USE_TZ is off)."""
    if settings.USE_TZ:
        return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)
    return timezone.make_naive(value, timezone.get_default_timezone()) if timezone.is_aware(value) else value


def host_skew(*, samples: int = 3) -> timedelta:
    """How far this host's clock is ahead of the database's (negative: behind), from the sample with the shortest
    round trip, whose midpoint is the best estimate of when the database read its clock."""
    best: tuple[float, timedelta] | None = None
    for _ in range(max(1, samples)):
        before = time.time()
        began = time.monotonic()
        database = Clock(-moved()).now()  # the database's own clock, whatever a test clock says
        took = time.monotonic() - began
        host = datetime.fromtimestamp(before + took / 2, tz=UTC)
        if not timezone.is_aware(database):
            database = timezone.make_aware(database, timezone.get_default_timezone())
        if best is None or took < best[0]:
            best = (took, host - database)
    return best[1] if best is not None else timedelta(0)
