"""A worker process says how it stands, every few seconds, in the record: what a health check reads to tell that
workers run, whether they pick work up by listening or fell back to polling, and how far their clocks are off."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError

from durableruns import store
from durableruns.clock import Clock, host_skew

log = logging.getLogger("durableruns")


class Presence:
    """Reports one worker process (`name`, the owner it claims under) to run_worker."""

    def __init__(
        self, name: str, *, threads: int, pickup: Callable[[], str], in_hand: Callable[[], int], clock: Clock
    ) -> None:
        self.name = name
        self.threads = threads
        self.pickup = pickup
        self.in_hand = in_hand
        self.clock = clock

    def report(self, *, stopped: bool = False) -> None:
        """Write the row now; a database error is only logged (the workers meet it too and stop the pass)."""
        try:
            skew = host_skew(samples=1).total_seconds()
            store.report_presence(
                self.name,
                threads=self.threads,
                pickup=self.pickup(),
                skew_seconds=skew,
                runs_in_hand=self.in_hand(),
                stopped=stopped,
                clock=self.clock,
            )
        except (DatabaseError, InterfaceError) as exc:
            log.warning("worker %s: could not report its presence: %s", self.name, exc)
