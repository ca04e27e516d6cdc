"""The one clock that decides ownership and proof of absence: the database server's.

Several cron hosts run workers against one database, and their own clocks differ. A lease's expiry, an attempt's
start, finish and last renewal, a wake time, and the moment a lookup's "not found" may be trusted are therefore
taken from the database in the statement that records or compares them (PostgreSQL's `now()`); no host's clock
is ever compared with another's. On SQLite the database runs inside the one host, so that host's clock is the
database's. A host's own clock only measures durations inside one process (`time.monotonic()`).

`Clock(shift=...)` moves the database's clock forward for tests (past a lookup's lag, a backoff), uniformly in
every statement and comparison, so two clocks are never mixed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Clock:
    """The database's clock, moved by `shift` (zero outside tests)."""

    shift: timedelta = timedelta(0)

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
        moved = self.shift + after
        if not moved:
            return Now()
        return ExpressionWrapper(Now() + Value(moved), output_field=DateTimeField())


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
        database = Clock().now()
        took = time.monotonic() - began
        host = datetime.fromtimestamp(before + took / 2, tz=UTC)
        if not timezone.is_aware(database):
            database = timezone.make_aware(database, timezone.get_default_timezone())
        if best is None or took < best[0]:
            best = (took, host - database)
    return best[1] if best is not None else timedelta(0)
