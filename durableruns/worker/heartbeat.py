"""One renewer for every lease a worker process holds: one statement per beat, however many runs are in hand.

A paused or dead process stops renewing, and that is what lets another worker take its runs over. Beats keep a
fixed cadence (a third of the shortest lease held): a run taken or handed back changes what the next beat renews,
never when it comes, so a busy pool cannot starve its own leases. A beat that meets a database error drops the
thread's connection and the next beat connects anew: a connection killed under it (a restarted server, a pooler,
a network blip) must not cost the leases. The same thread starts what a pass defers to it (Heartbeat.after: the
watchdog, once its first look is due), so a pass shorter than that starts this thread alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from django.db import DatabaseError, InterfaceError, connections

from durableruns import conf, store
from durableruns.clock import Clock
from durableruns.store import Lease

log = logging.getLogger("durableruns")


class Heartbeat:
    """Renews the leases handed to `hold` until they are `drop`ped; a thread of its own while started."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or store.DATABASE
        self._held: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._deferred: list[tuple[float, Callable[[], object]]] = []  # (monotonic time, what to start then)
        self.beats = 0  # statements sent: one per beat, whatever the number of leases it renewed
        self.renewed = 0  # leases renewed, over all beats

    # -- what the workers call -----------------------------------------------------------------------------

    def hold(self, lease: Lease) -> None:
        """Renew `lease` from the next beat on. The thread is woken only if the beats must come sooner: it was idle
        (nothing held), or this lease is shorter than every one held; otherwise the next beat, when it comes,
        renews this one too (a run taken changes what a beat renews, not when it comes)."""
        with self._lock:
            sooner = all(lease.seconds < held.seconds for held in self._held.values())  # True if none is held
            self._held[lease.run_id] = lease
        if sooner:
            self._changed.set()

    def drop(self, lease: Lease) -> None:
        """Stop renewing `lease` (the run was handed back, or lost)."""
        with self._lock:
            if self._held.get(lease.run_id) == lease:
                del self._held[lease.run_id]

    def held(self) -> list[Lease]:
        with self._lock:
            return list(self._held.values())

    def after(self, seconds: float, start: Callable[[], object]) -> None:
        """Have this thread call `start` once `seconds` have passed, if it still runs then. A helper whose first
        look comes after an interval (the watchdog) is started that way: a pass shorter than the interval (a
        single pass in-process, a run or two) costs no thread of its own."""
        with self._lock:
            self._deferred.append((time.monotonic() + seconds, start))
        self._changed.set()

    def _start_deferred(self, now: float) -> float | None:
        """Start what has come due; return when the next of the others comes (monotonic), if any."""
        with self._lock:
            due = [start for at, start in self._deferred if at <= now]
            self._deferred = [(at, start) for at, start in self._deferred if at > now]
            later = min((at for at, _ in self._deferred), default=None)
        for start in due:
            try:
                start()
            except Exception:  # a helper that cannot start must not cost the leases this thread renews
                log.exception("heartbeat: could not start %r", start)
        return later

    # -- the thread ------------------------------------------------------------------------------------------

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="durableruns-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped = True
        self._changed.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        next_beat: float | None = None
        try:
            while not self._stopped:
                now = time.monotonic()
                deferred = self._start_deferred(now)
                leases = self.held()
                if not leases:
                    next_beat = None
                    self._changed.wait(None if deferred is None else deferred - now)
                    self._changed.clear()
                    continue
                interval = min(lease.seconds for lease in leases) / 3
                if next_beat is None:  # the first lease since the thread was idle: it was just taken, fresh
                    next_beat = now + interval
                next_beat = min(next_beat, now + interval)  # a shorter lease arrived: beat sooner
                if now < next_beat:
                    self._changed.wait((next_beat if deferred is None else min(next_beat, deferred)) - now)
                    self._changed.clear()
                    continue
                self.beat(leases)
                next_beat = time.monotonic() + interval
        finally:
            for opened in connections.all(initialized_only=True):  # this thread's own, if it renewed at all
                opened.close()

    def beat(self, leases: list[Lease]) -> None:
        """Renew `leases` in one statement; forget those another worker took or that were handed back."""
        try:
            renewed = store.renew_all(leases, clock=self.clock)
        except (DatabaseError, InterfaceError) as exc:  # InterfaceError: its connection was closed under it
            log.warning("%d lease(s) not renewed (%s); reconnecting for the next beat", len(leases), str(exc).strip())
            _drop_connection()
            return
        self.beats += 1
        self.renewed += len(renewed)
        for lease in leases:
            if lease.run_id not in renewed:
                log.info("run %s: lease not renewed: released or taken over", lease.run_id)
                self.drop(lease)


def _drop_connection() -> None:
    """Discard this thread's database connection (it may be broken); Django opens a new one on next use."""
    db = connections[conf.database()]
    try:
        db.close()
    except (DatabaseError, InterfaceError):  # closing a broken connection can fail too; it is gone either way
        db.connection = None
