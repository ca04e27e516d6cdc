"""Pick up in milliseconds: idle worker threads are woken by PostgreSQL's LISTEN/NOTIFY, not by their next poll.

Whatever makes a run due now notifies the channel in the same transaction (a new run, a staff decision or retry,
a run handed back or set to wait), so the notification is delivered on commit and never for a rollback. A run
that comes due later (a wake time, a lease that runs out) is met by a timer: an idle thread asks the database
when the next one is due and waits no longer than that. Polling stays as the fallback and the safety net: the
listener runs on a dedicated connection of its own, and if that connection is lost (PostgreSQL restarted) the
workers poll at their interval meanwhile, it says so once in the log, and listens again as soon as it can.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from durableruns.pgsql import NEXT_DUE, next_due_from_last_claim
from durableruns.pgsql import WAKE_CHANNEL as CHANNEL
from durableruns.worker.background import Background
from durableruns.worker.pool import Waker

log = logging.getLogger("durableruns")

_NEXT_DUE = "SELECT " + NEXT_DUE


def seconds_until_next_due() -> float | None:
    """Seconds until the earliest wake time or lease expiry the record holds (negative: already due), on the
    database's clock; None if no run will come due by itself.

    An idle thread asks just after its claim found nothing, and that claim read it already (pgsql.NEXT_DUE):
    that reading is used then, less the time since, instead of a statement of its own."""
    known, seconds = next_due_from_last_claim()
    if known:
        return seconds
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(_NEXT_DUE)
        (seconds,) = cursor.fetchone()
    return None if seconds is None else float(seconds)


class Listener(Background):
    """LISTEN on the channel from a thread and a connection of its own; wake `waker` on every notification."""

    RETRY_SECONDS = 1.0  # how soon a lost listener tries to listen again

    thread_name = "durableruns-listener"

    def __init__(self, waker: Waker) -> None:
        super().__init__()
        self.waker = waker
        self.listening = threading.Event()
        self.lost_since: str | None = None  # why it is polling, while it is
        self.notifications = 0
        self._params = _connection_params()

    @property
    def state(self) -> str:
        if self.listening.is_set():
            return f"listening on {CHANNEL}"
        return f"polling (listener lost: {self.lost_since})" if self.lost_since else "polling (not listening yet)"

    def _run(self) -> None:
        import psycopg  # here: a SQLite-only site (no [postgres] extra) imports this module, and never listens

        while not self._stopped.is_set():
            try:
                with psycopg.connect(**self._params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if self.lost_since is not None:
                        log.warning("listener: listening on %s again", CHANNEL)
                    self.lost_since = None
                    self.listening.set()
                    self.waker.hearing = True
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
                self._stopped.wait(self.RETRY_SECONDS)
        self.waker.hearing = False
        self.listening.clear()


def _connection_params() -> dict[str, Any]:
    """What Django would connect with (host, credentials, the site's OPTIONS, durableruns' timeouts), for a plain
    psycopg connection outside Django's per-thread handling."""
    params = dict(connections[DEFAULT_DB_ALIAS].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool"):
        params.pop(django_only, None)
    return params
