"""A --loop worker's bulk acts (durableruns.bulks): a thread of its own takes pending items in batches while there
are any, resting between batches so that it works DURABLERUNS_BULK_SHARE of its time (a bulk of thousands is
background work: the claims and steps beside it keep the machine), and looks again every `poll` seconds when there
are none. It has its own connection, so the threads that
claim runs never wait for it; several workers share a bulk (SKIP LOCKED on its items)."""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, InterfaceError, connections

from durableruns import bulks, conf
from durableruns.clock import Clock
from durableruns.worker.background import Background

log = logging.getLogger("durableruns")


class BulkWorker(Background):
    """Act on bulks' pending items until stopped."""

    thread_name = "durableruns-bulks"

    def __init__(self, *, clock: Clock, poll: float = 1.0) -> None:
        super().__init__()
        self.clock = clock
        self.poll = poll
        self.taken = 0

    def _run(self) -> None:
        share = conf.bulk_share()
        try:
            while not self._stopped.is_set():
                began = time.monotonic()
                try:
                    batch = bulks.work(clock=self.clock)
                except (DatabaseError, InterfaceError) as exc:  # nothing half done: the batch rolled back
                    log.warning("bulks: could not act on pending items: %s", exc)
                    connections.close_all()
                    self._stopped.wait(self.poll)
                    continue
                self.taken += batch.taken
                if not batch.taken:
                    self._stopped.wait(self.poll)
                elif share < 1:
                    self._stopped.wait(conf.rest_after(time.monotonic() - began, share))
        finally:
            connections.close_all()  # this thread's own
