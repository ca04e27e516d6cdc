"""Pick up in milliseconds: idle worker threads are woken by PostgreSQL's LISTEN/NOTIFY, not by their next poll.

Whatever makes a run due now notifies the channel in the same transaction (a new run, a staff decision or retry,
a run handed back or set to wait), so the notification is delivered on commit and never for a rollback. A run
that comes due later (a wake time, a lease that runs out) is met by a timer: an idle thread asks the database
when the next one is due and waits no longer than that. Polling stays as the fallback and the safety net: the
listener runs on a dedicated connection of its own, and if that connection is lost (PostgreSQL restarted) the
workers poll at their interval meanwhile, it says so once in the log, and listens again as soon as it can.

A LISTEN that nothing reaches is worse than none: a transaction pooler (PgBouncer in transaction mode) accepts it,
then hands its server connection to other clients, and the worker would say it listens while it polls. So each
time it starts listening, the listener sends a NOTIFY of its own on a private channel through the runs' own
database alias (the way every real notification comes) and waits PROBE_SECONDS for it on the listening
connection. If it does not come back, the worker polls and says so once, in its start line, its summary and its
presence row; DURABLERUNS_LISTEN_DATABASE names an alias that reaches PostgreSQL directly, for the LISTEN alone.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import TYPE_CHECKING, Any

from django.db import connections

from durableruns import conf
from durableruns.clock import moved
from durableruns.connections import plain_params
from durableruns.store.claims import NEXT_DUE, next_due_from_last_claim
from durableruns.store.sql import WAKE_CHANNEL as CHANNEL
from durableruns.worker.background import Background

if TYPE_CHECKING:
    import psycopg
from durableruns.worker.pool import Waker

log = logging.getLogger("durableruns")

_NEXT_DUE = "SELECT " + NEXT_DUE


def seconds_until_next_due() -> float | None:
    """Seconds until the earliest wake time or lease expiry the record holds (negative: already due), on the
    database's clock; None if no run will come due by itself.

    An idle thread asks just after its claim found nothing, and that claim read it already (store.claims.NEXT_DUE):
    that reading is used then, less the time since, instead of a statement of its own."""
    known, seconds = next_due_from_last_claim()
    if known:
        return seconds
    with connections[conf.database()].cursor() as cursor:
        shift: dict[str, Any] = {"shift": moved()}  # a test clock's move (durableruns.testing.clock): an interval
        cursor.execute(_NEXT_DUE, shift)
        (seconds,) = cursor.fetchone()
    return None if seconds is None else float(seconds)


class Listener(Background):
    """LISTEN on the channel from a thread and a connection of its own (on `alias`, DURABLERUNS_LISTEN_DATABASE by
    default); wake `waker` on every notification. `settled` is set once the first attempt has an answer: listening
    (a notification of its own came back), deaf (none did: polling for good), or lost (polling meanwhile)."""

    RETRY_SECONDS = 1.0  # how soon a lost listener tries to listen again
    PROBE_SECONDS = 2.0  # how long its own notification may take to come back before the worker calls itself deaf

    thread_name = "durableruns-listener"

    def __init__(self, waker: Waker, *, alias: str | None = None) -> None:
        super().__init__()
        self.waker = waker
        self.alias = alias or conf.listen_database()
        self.listening = threading.Event()
        self.settled = threading.Event()
        self.lost_since: str | None = None  # why it is polling, while it is
        self.deaf: str | None = None  # why it polls for good: notifications do not reach its LISTEN
        self.notifications = 0
        self._params = _connection_params(self.alias)
        self.runs_alias = conf.database()
        self._notify_params = _connection_params(self.runs_alias)  # the route every real notification takes

    @property
    def state(self) -> str:
        if self.listening.is_set():
            where = "" if self.alias == self.runs_alias else f" (database alias {self.alias!r})"
            return f"listening on {CHANNEL}{where}"
        if self.deaf is not None:
            return f"polling (notifications do not arrive: {self.deaf})"
        return f"polling (listener lost: {self.lost_since})" if self.lost_since else "polling (not listening yet)"

    def _run(self) -> None:
        import psycopg  # here: a SQLite-only site (no [postgres] extra) imports this module, and never listens

        while not self._stopped.is_set() and self.deaf is None:
            try:
                with psycopg.connect(**self._params, autocommit=True) as conn:
                    if not self._heard_itself(conn):
                        self.deaf = (
                            f"a NOTIFY of its own through database alias {self.runs_alias!r} did not reach its LISTEN "
                            f"on alias {self.alias!r} within {self.PROBE_SECONDS:g}s, as behind a transaction pooler; "
                            f"set DURABLERUNS_LISTEN_DATABASE to an alias that connects to PostgreSQL directly"
                        )
                        log.warning("listener: notifications do not arrive (%s): polling", self.deaf)
                        break
                    conn.execute(f"LISTEN {CHANNEL}")
                    if self.lost_since is not None:
                        log.warning("listener: listening on %s again", CHANNEL)
                    self.lost_since = None
                    self.listening.set()
                    self.waker.hearing = True
                    self.settled.set()
                    self.waker.wake()  # what came due while nobody listened is picked up now
                    while not self._stopped.is_set():
                        for _ in conn.notifies(timeout=0.5):
                            self.notifications += 1
                            self.waker.wake()
                        if conn.closed:
                            raise psycopg.OperationalError("the listening connection was closed")
            except psycopg.Error as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self.waker.hearing = False  # before anything else: a notification may be lost from now on
                if self.listening.is_set() or self.lost_since is None:
                    log.warning("listener lost (%s): polling until it is back", reason)
                self.listening.clear()
                self.lost_since = reason
                self.settled.set()
                self._stopped.wait(self.RETRY_SECONDS)
        self.waker.hearing = False
        self.listening.clear()
        self.settled.set()

    def _heard_itself(self, conn: psycopg.Connection[Any]) -> bool:
        """Send a NOTIFY on a channel of this listener's own, through the runs' alias, and say whether it reached
        `conn` within PROBE_SECONDS. The work channel is listened to after it: the wake that follows finds
        whatever came due meanwhile."""
        probe = f"durableruns_probe_{secrets.token_hex(8)}"
        conn.execute(f"LISTEN {probe}")
        import psycopg  # here, as in _run: a SQLite-only site never listens

        with psycopg.connect(**self._notify_params, autocommit=True) as sender:
            sender.execute(f"NOTIFY {probe}")
        heard = any(True for _ in conn.notifies(timeout=self.PROBE_SECONDS, stop_after=1))
        conn.execute(f"UNLISTEN {probe}")
        return heard


def _connection_params(alias: str) -> dict[str, Any]:
    """What Django would connect `alias` with, for a plain psycopg connection (durableruns.connections)."""
    return plain_params(alias)
