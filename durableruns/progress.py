"""What a step says of itself while it runs: `ctx.progress(message, done=..., total=...)`.

`ctx.progress` stays the dict a checkpointed loop commits (durableruns.context), and is callable too: a call is
checked at once (TypeError, ValueError in the step), then committed on the attempt's row, fenced on the lease
epoch (store.record_progress), at most once a second per step. A call within the second after a commit is held,
the latest only: the next call after the second commits its own, newer report, and the step's end commits the one
still held, just before its result. A step that never calls it costs no statement. The second is measured on
this process's own clock (a duration, time.monotonic); the moment recorded is the database's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from durableruns.errors import DeclarationError

MAX_MESSAGE = 500  # characters
INTERVAL = 1.0  # seconds between two commits of one step's progress
BIGGEST = 2**63 - 1  # what the columns hold

Report = tuple[str, int | None, int | None]
Write = Callable[[str, int | None, int | None], None]


def checked(message: Any, done: Any, total: Any) -> Report:
    """The report, or TypeError / ValueError saying what is wrong with it."""
    if not isinstance(message, str):
        raise TypeError(f"progress message must be a str, not {type(message).__name__}")
    if len(message) > MAX_MESSAGE:
        raise ValueError(f"progress message is {len(message)} characters long; at most {MAX_MESSAGE}")
    if "\x00" in message:
        raise ValueError("progress message must not contain NUL characters")
    for name, value in (("done", done), ("total", total)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"progress {name} must be an int or None, not {type(value).__name__}")
        if not 0 <= value <= BIGGEST:
            raise ValueError(f"progress {name} must be a non-negative int, not {value}")
    return message, done, total


class Progress(dict[str, Any]):
    """The step's checkpointed progress (a dict) that is also `ctx.progress(message, *, done=None, total=None)`.

    `write` commits a report (None: a context that records nothing, such as a lookup's, only checks it)."""

    def __init__(
        self,
        initial: dict[str, Any] | None = None,
        write: Write | None = None,
        *,
        interval: float = INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(initial or {})
        self._write = write
        self._interval = interval
        self._monotonic = monotonic
        self._last: float | None = None  # when this process last committed one (its own clock: a duration)
        self._held: Report | None = None
        self._thread = threading.get_ident()  # the step's thread: the only one that writes the record

    def __call__(self, message: str, *, done: int | None = None, total: int | None = None) -> None:
        """Report the step's progress: committed now, or held (the latest) if one was committed under a second ago."""
        report = checked(message, done, total)
        if threading.get_ident() != self._thread:
            raise DeclarationError("ctx.progress from ctx.map's threads: report progress from the step")
        now = self._monotonic()
        if self._last is not None and now - self._last < self._interval:
            self._held = report
            return
        self._commit(report, now)

    def flush(self) -> None:
        """Commit the report still held, if any (the step's end)."""
        if self._held is not None:
            self._commit(self._held, self._monotonic())

    def _commit(self, report: Report, now: float) -> None:
        self._held = None
        self._last = now
        if self._write is not None:
            self._write(*report)
