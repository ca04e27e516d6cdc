"""The hot path on PostgreSQL: each fact the engine records is ONE fenced statement, so one round trip and
one commit (autocommit makes a single statement its own transaction).

The fence is a data-modifying CTE on run_state conditioned on the worker's epoch (and, for a result, on the
attempt still being `started`); every other write in the statement reads from it, so a stale worker writes
nothing at all. PostgreSQL runs every data-modifying CTE to completion whether or not the outer query reads
it. The store's modules keep their statements beside their functions and call them only when the connection
is PostgreSQL, falling back to the ORM otherwise; this module is what they share: the prepared cursor, one()
and rowcount(), a commit that waits for a standby, and the wake-up channel.

The fenced statements, and the insert of a new run, are server-side prepared (DURABLERUNS_PREPARED_STATEMENTS, on
by default), so PostgreSQL parses them once per connection and, once it has seen that a generic plan does as well
as a custom one, stops planning them: planning was a third of a step's time in the database. A cached plan is only as good as the
table sizes it was made for (on a table of a few pages PostgreSQL scans sequentially, and keeps doing so as it
grows), so each connection prepares its statements anew every REPLAN_EVERY executions: a plan outlives at most
that many rows of growth. The claim is prepared too, and planned only under its own planner setting (below).
Django's own queries keep its client-side binding. A deployment behind a pooler that cannot keep
prepared statements turns preparing off; durableruns also turns it off by itself on any connection that reaches
PostgreSQL through something in between (a pooler such as PgBouncer in transaction mode runs a client's
consecutive transactions on different server connections, where a statement prepared on one does not exist):
one whose server port, inet_server_port(), is not the port it connected to."""

from __future__ import annotations

import functools
import logging
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from durableruns import conf

log = logging.getLogger("durableruns")

if TYPE_CHECKING:
    import psycopg


# psycopg itself is imported only where a statement goes to PostgreSQL: a SQLite-only site installs durableruns
# without the [postgres] extra, and still imports this module (the store does).


# The channel on which whatever makes a run due wakes idle workers (durableruns.worker.listener); a notification
# is delivered when its transaction commits, never for a rollback.
WAKE_CHANNEL = "durableruns_due"
WAKE = f"SELECT pg_notify('{WAKE_CHANNEL}', '')"


# A literal, a comment, or a run of white space: what compact() keeps, drops, or makes one space.
_TOKENS = re.compile(r"('(?:[^']|'')*')|(--[^\n]*)|(\s+)")


def compact(sql: str) -> str:
    """`sql` without its comments and with one space for each run of white space outside its literals. psycopg
    caches how it parses a statement's %(name)s placeholders only up to 4,096 bytes: the claim, commented and
    indented, is longer, and was parsed again at every execution."""
    return _TOKENS.sub(lambda m: m.group(1) or ("" if m.group(2) else " "), sql).strip()


@functools.cache
def _prepared_cursor() -> type[psycopg.Cursor[Any]]:
    """The class of a server-side binding cursor whose every statement is prepared (parsed once per connection)."""
    import psycopg

    class PreparedCursor(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                    binary: bool | None = None) -> PreparedCursor:
            super().execute(query, params, prepare=True, binary=binary)
            return self

    return PreparedCursor


# Above any count a statement reaches, so psycopg prepares nothing on its own: only what asks (prepare=True).
_ONLY_WHEN_ASKED = 2**62
# Executions of the hot path on one connection after which its statements are prepared (and planned) anew.
REPLAN_EVERY = 1000


class HotPath:
    """What the hot path keeps for one connection: a prepared cursor, reused for every statement (a step
    makes one), how many statements it ran, and their texts for the current plan generation."""

    def __init__(self, db: Any) -> None:
        self.raw = db.connection
        self.prepares = not through_a_proxy(self.raw)
        if not self.prepares:
            # Nothing prepared on this connection, not even by psycopg on its own (a site's prepare_threshold):
            # the next transaction may run on another server connection.
            self.raw.prepare_threshold = None
            return
        if self.raw.prepare_threshold is None:  # Django turns preparing off for the whole connection by default
            self.raw.prepare_threshold = _ONLY_WHEN_ASKED
        self.cursor = CursorWrapper(_prepared_cursor()(self.raw), db)  # wrapped like Django's own cursors
        self.executions = 0
        self._generation = 0
        self._texts: dict[str, str] = {}

    def text(self, sql: str) -> str:
        """`sql` as this connection prepares it now, tagged with its plan generation: a new tag is a new
        statement to psycopg, which prepares it and, past its cache size (prepared_max), deallocates the oldest."""
        generation = self.executions // REPLAN_EVERY
        self.executions += 1
        if generation != self._generation:
            self._generation, self._texts = generation, {}
        text = self._texts.get(sql)
        if text is None:
            text = self._texts[sql] = f"{compact(sql)}\n-- plan generation {generation}"
        return text


_ATTRIBUTE = "durableruns_hot_path"  # on Django's connection wrapper, which is per thread like the connection


def hot_path() -> HotPath | None:
    """This thread's connection's hot path, or None where Django logs queries (DEBUG, CaptureQueriesContext)
    or preparing is off: there the statements go through Django's own cursor with their values, like every
    other query."""
    db = connections[conf.database()]
    if db.queries_logged or not conf.prepared_statements():
        return None
    db.ensure_connection()
    hot: HotPath | None = getattr(db, _ATTRIBUTE, None)
    if hot is None or hot.raw is not db.connection:  # first use, or Django has connected again since
        hot = HotPath(db)
        setattr(db, _ATTRIBUTE, hot)
    return hot if hot.prepares else None


_proxied_said = False


def through_a_proxy(raw: psycopg.Connection[Any]) -> bool:
    """Whether `raw` reaches PostgreSQL through a proxy or pooler: the server listens on another port than the
    one this connection was made to (a Unix socket straight to the server reports none, and is direct)."""
    global _proxied_said
    (server_port,) = raw.execute("SELECT inet_server_port()").fetchone() or (None,)
    try:
        client_port = int(raw.info.port)
    except (TypeError, ValueError):
        return False
    proxied = server_port is not None and int(server_port) != client_port
    if proxied and not _proxied_said:
        _proxied_said = True
        log.info("connected on port %s to PostgreSQL listening on port %s: through a pooler or proxy, so "
                 "nothing is prepared on the server (DURABLERUNS_PREPARED_STATEMENTS)", client_port, server_port)
    return proxied


def one(sql: str, params: dict[str, Any]) -> Any:
    hot = hot_path()
    if hot is None:
        with connections[conf.database()].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    hot.cursor.execute(hot.text(sql), params)
    return hot.cursor.fetchone()


def rowcount(sql: str, params: dict[str, Any]) -> int:
    hot = hot_path()
    if hot is None:
        with connections[conf.database()].cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)
    hot.cursor.execute(hot.text(sql), params)
    return int(hot.cursor.rowcount)


# Every time in these statements is the database's now() moved by `shift` (zero outside tests), and a lease runs
# `lease` from it: no host's clock decides who owns a run (durableruns.clock).
Times = dict[str, timedelta]


def notify_workers() -> None:
    """Notify idle workers from the current transaction (on its commit) or, in autocommit, at once."""
    with connections[conf.database()].cursor() as cursor:
        cursor.execute(WAKE)


def waiting_for_standby(sql: str, params: dict[str, Any], level: str) -> tuple[Any, int]:
    """Run one fenced statement in a transaction of its own whose commit waits at synchronous_commit `level`
    (SET LOCAL: this transaction only; PostgreSQL reads it when it commits); return its first row and rowcount.

    Prepared, the four go in one round trip (a pipeline), as the claim's do; unprepared, BEGIN, the setting and
    the statement go as one query string and COMMIT after it."""
    if level not in conf.STANDBY_LEVELS:  # spelled into the SQL: only the levels conf allows
        raise ValueError(f"not a synchronous_commit level that waits for a standby: {level!r}")
    import psycopg  # here: see the module's imports
    setting = f"SET LOCAL synchronous_commit = {level}"
    db = connections[conf.database()]
    hot = hot_path()
    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        try:
            if hot is None:
                wrapper = CursorDebugWrapper if db.queries_logged else CursorWrapper
                with wrapper(psycopg.ClientCursor(raw), db) as cursor:
                    cursor.execute(f"BEGIN;\n{setting};\n{sql}", params)
                    cursor.nextset()  # past the empty results of BEGIN and SET, to the statement's
                    cursor.nextset()
                    row = cursor.fetchone() if cursor.description else None
                    count = int(cursor.rowcount)
                raw.execute("COMMIT")
            else:
                with raw.pipeline():
                    raw.execute("BEGIN")
                    raw.execute(setting)
                    hot.cursor.execute(hot.text(sql), params)
                    raw.execute("COMMIT")
                row = hot.cursor.fetchone() if hot.cursor.description else None
                count = int(hot.cursor.rowcount)
        except BaseException:
            if not raw.closed and raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raw.execute("ROLLBACK")
            raise
    return row, count
