"""A --loop worker's bulk acts (durableruns.bulks): a thread of its own takes pending items in batches while there
are any, and looks again every `poll` seconds when there are none. It has its own connection, so the threads that
claim runs never wait for it; several workers share a bulk (SKIP LOCKED on its items).

A bulk is background work: on Linux the thread lowers its own CPU priority (NICE_INCREMENT more than the
process's), so on a busy host the threads that claim and run steps go first and the bulk takes what they leave.
"""

from __future__ import annotations

import logging
import os
import threading

from django.db import DatabaseError, InterfaceError, connections

from durableruns import bulks
from durableruns.clock import Clock
from durableruns.worker.background import Background

log = logging.getLogger("durableruns")

NICE_INCREMENT = 10


def lower_priority() -> None:
    """Lower this thread's CPU priority by NICE_INCREMENT, where the OS lets a thread have its own (Linux)."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + NICE_INCREMENT))
    except (AttributeError, OSError):  # no per-thread priority here: the bulk runs at the process's
        pass


class BulkWorker(Background):
    """Act on bulks' pending items until stopped."""

    thread_name = "durableruns-bulks"

    def __init__(self, *, clock: Clock, poll: float = 1.0) -> None:
        super().__init__()
        self.clock = clock
        self.poll = poll
        self.taken = 0

    def _run(self) -> None:
        lower_priority()
        try:
            while not self._stopped.is_set():
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
        finally:
            connections.close_all()  # this thread's own
