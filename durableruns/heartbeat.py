"""Lease renewal: one thread per process renews the lease of every run in hand, so a long step keeps its run.

A paused or dead process stops renewing, and that is what lets another worker take the run over. The thread is
started once, on first need, and then serves every engine of the process, however many passes it makes: a
thread per pass cost as much as a step's bookkeeping when a pass works one short run. It holds no database
connection between renewals (a lease is renewed every third of its length, so reconnecting is rare), and one
that fails is dropped with it, so a restarted database or a test database being torn down never meets a
connection of its own.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connections

from durableruns import store
from durableruns.errors import FencedOut
from durableruns.store import Lease

log = logging.getLogger("durableruns")
Clock = Callable[[], datetime]


@dataclass
class _Held:
    lease: Lease
    clock: Clock
    due: float  # time.monotonic() of the next renewal


class Renewer:
    """The process's lease renewer. `hold(lease, clock)` starts renewing and returns a ticket; `release(ticket)`
    stops. A lease is first renewed a third of its length after it is held."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._changed = threading.Condition()
        self._held: dict[int, _Held] = {}
        self._tickets = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._pid = 0

    def hold(self, lease: Lease, clock: Clock) -> int:
        with self._changed:
            ticket = next(self._tickets)
            self._held[ticket] = _Held(lease=lease, clock=clock, due=self._monotonic() + lease.seconds / 3)
            self._ensure_thread()
            self._changed.notify()
        return ticket

    def release(self, ticket: int) -> None:
        with self._changed:
            self._held.pop(ticket, None)

    def holding(self) -> list[Lease]:
        """The leases being renewed now."""
        with self._changed:
            return [held.lease for held in self._held.values()]

    def _ensure_thread(self) -> None:
        # A forked child (a pre-forking server) has the parent's record of the thread, not the thread.
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._renew_forever, name="durableruns-heartbeat", daemon=True)
            self._thread.start()

    def _renew_forever(self) -> None:
        while True:
            with self._changed:
                now = self._monotonic()
                due = [(ticket, held) for ticket, held in self._held.items() if held.due <= now]
                if not due:
                    soonest = min((held.due for held in self._held.values()), default=None)
                    self._changed.wait(None if soonest is None else soonest - now)
                    continue
                for _, held in due:
                    held.due = now + held.lease.seconds / 3
            try:
                for ticket, held in due:
                    if not self._renew(held):
                        self.release(ticket)
            finally:
                for opened in connections.all(initialized_only=True):  # this thread's own
                    opened.close()

    @staticmethod
    def _renew(held: _Held) -> bool:
        """Renew one lease; False once it is no longer ours to renew."""
        try:
            store.renew(held.lease, now=held.clock())
        except FencedOut:
            log.info("run %s: lease not renewed: released or taken over", held.lease.run_id)
            return False
        except DatabaseError as exc:  # the main thread meets the same error on its next write
            log.warning("lease not renewed: %s", exc)
        return True


RENEWER = Renewer(time.monotonic)
