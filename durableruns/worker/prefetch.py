"""The runs a single pass claimed ahead (durableruns.store.prefetch) and has not begun yet: whichever thread of the
process is free next begins the first of them, before it claims again.

Their leases are the heartbeat's from the claim on, as the run in hand's is. A thread whose claim found nothing
waits for the claims still under way in the process before it leaves the pass: one of them may leave runs here.
What is left when the pass ends (a stop asked for, --max-seconds) is handed back at once, due again for any
worker, instead of waiting for the leases to run out.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

from django.db import DatabaseError, DataError, IntegrityError, InterfaceError

from durableruns.clock import Clock
from durableruns.registry import first_steps
from durableruns.store import Claimed
from durableruns.store.prefetch import claim_several, hand_back
from durableruns.worker.heartbeat import Heartbeat

log = logging.getLogger("durableruns")


class Ahead:
    """The pass's runs claimed and not begun, in the claims' order."""

    def __init__(self, heartbeat: Heartbeat, lease_seconds: float, clock: Clock) -> None:
        self._heartbeat = heartbeat
        self._lease_seconds = lease_seconds
        self._clock = clock
        self._runs: deque[Claimed] = deque()
        self._condition = threading.Condition()
        self._claiming = 0  # claims under way in the process

    def take(self) -> Claimed | None:
        """The first run waiting here, taken; None if none is."""
        with self._condition:
            return self._runs.popleft() if self._runs else None

    def __len__(self) -> int:
        with self._condition:
            return len(self._runs)

    @contextmanager
    def claiming(self) -> Iterator[None]:
        """Count a claim under way while the block runs."""
        with self._condition:
            self._claiming += 1
        try:
            yield
        finally:
            with self._condition:
                self._claiming -= 1
                self._condition.notify_all()

    def claim(self, owner: str, *, most: int, queues: tuple[str, ...], skip: Collection[str]) -> list[Claimed]:
        """Claim at most `most` runs in one statement (store.prefetch.claim_several), counted as under way until
        those not begun at once are kept here; return them all, the one to begin first. The database refused a
        first intent riding on it (a run's data): [], and nothing was taken."""
        try:
            with self.claiming():
                taken = claim_several(
                    owner=owner,
                    lease_seconds=self._lease_seconds,
                    most=most,
                    clock=self._clock,
                    first_steps=first_steps(),
                    queues=queues,
                    skip=skip,
                )
                self.keep(taken[1:])
        except (DataError, IntegrityError):
            return []
        return taken

    def keep(self, runs: list[Claimed]) -> None:
        """Keep `runs` (claimed, not begun) for the next free threads; their leases are renewed from now on."""
        for claimed in runs:
            self._heartbeat.hold(claimed.lease)
        with self._condition:
            self._runs.extend(runs)
            self._condition.notify_all()

    def after_claims(self, *, stopping: Callable[[], bool]) -> Claimed | None:
        """Once no claim of the process is under way (or a stop is asked for), the first run one left here, taken;
        None if none did."""
        with self._condition:
            while self._claiming and not self._runs and not stopping():
                self._condition.wait(0.05)
            return self._runs.popleft() if self._runs else None

    def hand_back(self) -> int:
        """Hand every run still waiting here back to be due at once (store.prefetch.hand_back); return how many
        were. One the database cannot take back now is left to its lease, which runs out as the heartbeat stops."""
        with self._condition:
            runs, self._runs = list(self._runs), deque()
        given = 0
        for claimed in runs:
            try:
                given += hand_back(claimed, clock=self._clock)
            except (DatabaseError, InterfaceError) as exc:
                log.error(
                    "run %s: claimed ahead and not begun, could not be handed back (%s); it is taken again "
                    "once its lease runs out",
                    claimed.lease.run_id,
                    exc,
                )
            finally:
                self._heartbeat.drop(claimed.lease)
        if runs:
            log.warning("handed back %d run(s) claimed ahead and not begun", given)
        return given
