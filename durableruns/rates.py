"""Step rate limits: the arithmetic of whose turn it is. No Django, no I/O.

`@wf.step(..., rate="5/s", rate_key=...)` promises that at most N attempts of the step per key start in any window
of that length, across every worker and host, on the database's clock. The record keeps a log per (step, key):
each start, at the database's time it was taken, and each turn a waiting run has been given (a reservation). A
sliding window over the starts keeps the promise exactly (a token bucket of N refilling N per window would let
2N - 1 start within one window after a quiet spell): an attempt starts at `now` only while fewer than N starts
lie in (now - window, now]. The reservations only order the waiting runs and give each the moment its turn
comes, so that a run waits once, until a computed time, instead of every waiting run waking when one slot frees.

durableruns.store.rates reads the log under a per-(step, key) lock and records what `turn` decides.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from durableruns.errors import DeclarationError

_UNITS = {"s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": timedelta(hours=1)}
_RATE = re.compile(r"([1-9][0-9]*)/([smh])")


@dataclass(frozen=True, kw_only=True)
class Rate:
    """At most `limit` starts in any window of length `window`."""

    limit: int
    window: timedelta

    def __str__(self) -> str:
        unit = next(u for u, w in _UNITS.items() if w == self.window)
        return f"{self.limit}/{unit}"


def parse_rate(text: object, *, where: str = "rate") -> Rate:
    """Read "N/s", "N/m" or "N/h" (N a positive whole number); anything else is a DeclarationError naming `where`."""
    match = _RATE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise DeclarationError(
            f'{where}: rate must be "N/s", "N/m" or "N/h" with N a positive whole number, not {text!r}'
        )
    return Rate(limit=int(match.group(1)), window=_UNITS[match.group(2)])


@dataclass(frozen=True, kw_only=True)
class Turn:
    """What `turn` decides: start now (`go`), or wait until `at` (the run's reservation, recorded at that time)."""

    go: bool
    at: datetime


def free_at(rate: Rate, *, now: datetime, starts: Sequence[datetime], margin: timedelta = timedelta(0)) -> datetime:
    """The earliest moment from `now` at which fewer than `rate.limit` of `starts` (each at or before now) lie in
    the window (lengthened by `margin`) ending there: now, or when the oldest of the last N starts leaves it."""
    span = rate.window + margin
    recent = sorted(s for s in starts if s > now - span)
    if len(recent) < rate.limit:
        return now
    return recent[-rate.limit] + span  # the window (t - span, t] leaves that start out from t = it + span


def turn(
    rate: Rate,
    *,
    now: datetime,
    starts: Sequence[datetime],
    reserved: Sequence[datetime] = (),
    mine: datetime | None = None,
    margin: timedelta = timedelta(0),
) -> Turn:
    """Whose turn it is: may an attempt start at `now`, or until when must it wait?

    `starts`: the bucket's recorded starts (at or before now; older ones are ignored). `reserved`: the turns other
    waiting runs hold. `mine`: the turn this run holds, if it waited already. `margin` lengthens the window (a
    start counts that much longer: DURABLERUNS_RATE_MARGIN_SECONDS). A run holding a turn starts once its time has
    come and the window has room (else it waits for the computed moment the window has room); a run without one
    starts now only if no reservation is ahead of it and the window has room, else it takes the next turn after
    the last one given: the first moment at which it would be one of at most N in its window, counting every start
    and every turn given as if it started then. Whatever the reservations say, a `go` is given only while fewer
    than N starts lie in (now - window - margin, now]: that alone keeps the promise.
    """
    span = rate.window + margin
    room = free_at(rate, now=now, starts=starts, margin=margin)
    if mine is not None:
        if mine > now:
            return Turn(go=False, at=mine)
        return Turn(go=room <= now, at=max(room, now))
    queue = sorted([s for s in starts if s > now - span] + [r for r in reserved if r > now - span])
    slot = max(room, now, queue[-1] if queue else now)
    if len(queue) >= rate.limit:
        slot = max(slot, queue[-rate.limit] + span)
    return Turn(go=slot <= now, at=slot)


# How the reason of a run waiting for its turn begins: readers look its turns up only for such a run.
WAITING_FOR_TURN = "waiting for the rate limit of "


def waiting_reason(step: str, key: str, until: datetime) -> str:
    """What a run waiting for its turn says: 'waiting for the rate limit of book_shipment (key dhl) until 14:07:12'."""
    keyed = f" (key {key})" if key else ""
    return f"{WAITING_FOR_TURN}{step}{keyed} until {until:%H:%M:%S}"
