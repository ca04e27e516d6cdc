"""Shared machinery of the simulated far systems: an effect ledger in a per-system SQLite file
plus fault injection (latency, rejections, lost replies).

Effects are committed in the far system's own short transaction, never inside the caller's
database transaction, so they survive the caller's crash or rollback exactly like a real
supplier order or card charge would, and tests can count them per key to detect duplicates.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar

from .config import FarConfig, FaultConfig, config_from_env
from .errors import FarRejected, FarTimeout

StrPath: TypeAlias = str | os.PathLike[str]
Effect: TypeAlias = dict[str, Any]

C = TypeVar("C", bound=FaultConfig)
T = TypeVar("T")

# Worker processes and the test process hit the same files; waiting up to this long for a
# lock turns contention into latency instead of "database is locked" errors.
BUSY_TIMEOUT_SECONDS: float = 30.0


def encode_payload(payload: Mapping[str, Any]) -> str:
    """Serialise a payload up front, so a bad argument fails before any fault is injected."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def require_key(name: str, value: object) -> str:
    """Reject empty or non-string keys: a missing key would silently defeat duplicate counting."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


_GENERATORS: dict[tuple[int, str, int | None], random.Random] = {}


def _generator(name: str, seed: int | None) -> random.Random:
    """The fault generator of system `name` in this process. Keyed by pid, so a forked worker draws its own
    faults (seeded alike when a seed is set: a seed promises a reproducible sequence)."""
    key = (os.getpid(), name, seed)
    if key not in _GENERATORS:
        _GENERATORS[key] = random.Random(seed)
    return _GENERATORS[key]


class FarSystem(ABC, Generic[C]):
    """Base of the six simulations: owns the SQLite ledger, fault injection and inspection.

    Subclasses set ``name`` (the file is ``<directory>/<name>.sqlite3``), may add columns and
    DDL for their own queries, and implement ``_select_config`` to pick their part of
    :class:`FarConfig` when no explicit config is given.
    """

    name: ClassVar[str]
    # Column definitions appended to the shared effects table, e.g. "lag REAL NOT NULL".
    extra_columns: ClassVar[tuple[str, ...]] = ()
    # Extra statements (indexes) run when the schema is created.
    extra_ddl: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: C | None = None, directory: StrPath | None = None) -> None:
        if config is None or directory is None:
            loaded = config_from_env()
            if config is None:
                config = self._select_config(loaded)
            if directory is None:
                directory = loaded.directory
        self.config: C = config
        self.directory: Path = Path(directory)
        self.path: Path = self.directory / f"{self.name}.sqlite3"
        self._pid = os.getpid()
        self._schema_ready = False

    @staticmethod
    @abstractmethod
    def _select_config(loaded: FarConfig) -> C:
        """Return this system's section of the loaded configuration."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={str(self.path)!r}, config={self.config!r})"

    # -- connections ------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: the sqlite3 module must not open transactions implicitly;
        # every write below issues its own BEGIN IMMEDIATE ... COMMIT.
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        conn.row_factory = sqlite3.Row
        # In WAL mode NORMAL loses nothing when a process is SIGKILLed (only on OS crash).
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _ensure_schema(self) -> None:
        if self._schema_ready:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        columns = ",\n".join(
            (
                "id INTEGER PRIMARY KEY AUTOINCREMENT",
                "key TEXT",
                "payload TEXT NOT NULL",
                "created_at REAL NOT NULL",
                *self.extra_columns,
            )
        )
        with closing(self._open()) as conn:
            self._enable_wal(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                # AUTOINCREMENT: ids are never reused, even after reset(), so an id handed out
                # before a reset can never alias a newer effect.
                conn.execute(f"CREATE TABLE IF NOT EXISTS effects (\n{columns}\n)")
                conn.execute("CREATE INDEX IF NOT EXISTS effects_key ON effects (key, id)")
                for statement in self.extra_ddl:
                    conn.execute(statement)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        self._schema_ready = True

    @staticmethod
    def _enable_wal(conn: sqlite3.Connection) -> None:
        """Switch the file to WAL, so readers (the test process) never block a writer.

        The mode is persistent in the file and inherited by later connections. Switching
        needs an exclusive lock and SQLite reports "database is locked" at once instead of
        calling the busy handler, which happens when several freshly started workers open
        a new ledger together; hence the explicit retry.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(random.uniform(0.005, 0.02))

    def _connect(self) -> sqlite3.Connection:
        self._ensure_schema()
        return self._open()

    def _check_fork(self) -> None:
        # Connections are opened per call, so nothing SQLite-related crosses a fork.
        self._pid = os.getpid()

    @property
    def _rng(self) -> random.Random:
        """This system's fault generator: one per process, seeded once, however many instances are built."""
        return _generator(self.name, self.config.seed)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding SQLite's write lock from its first statement.

        BEGIN IMMEDIATE (not the default deferred BEGIN) takes the lock before any read, so a
        read-then-insert inside it cannot interleave with another process doing the same.
        """
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A connection in autocommit mode: each SELECT reads one consistent WAL snapshot."""
        with closing(self._connect()) as conn:
            yield conn

    def _query(self, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row]:
        with self._reading() as conn:
            return conn.execute(sql, params).fetchall()

    # -- effects ----------------------------------------------------------------------------

    @staticmethod
    def _effect(row: sqlite3.Row) -> Effect:
        effect: Effect = dict(zip(row.keys(), row, strict=True))
        effect["payload"] = json.loads(effect["payload"])
        return effect

    def _insert(self, conn: sqlite3.Connection, *, key: str | None, payload: str, **extra: object) -> Effect:
        """Record one effect inside the caller's transaction and return it as stored."""
        # Timestamped after BEGIN IMMEDIATE acquired the lock, so created_at follows commit
        # order and "visible after lag" checks measure from (nearly) the commit.
        created_at = time.time()
        names = ("key", "payload", "created_at", *extra)
        sql = f"INSERT INTO effects ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"
        row_id = conn.execute(sql, (key, payload, created_at, *extra.values())).lastrowid
        row = conn.execute("SELECT * FROM effects WHERE id = ?", (row_id,)).fetchone()
        return self._effect(row)

    def _first_effect(self, conn: sqlite3.Connection, key: str, *, visible_after: float = 0.0) -> Effect | None:
        """The earliest effect recorded for ``key`` that is at least ``visible_after`` s old.

        Keyed systems that do not deduplicate may hold several effects per key; the earliest
        is the one the outside world saw first, so every lookup reports that one.
        """
        sql = "SELECT * FROM effects WHERE key = ?"
        params: list[object] = [key]
        if visible_after > 0:
            sql += " AND ? - created_at >= ?"
            params += [time.time(), visible_after]
        row = conn.execute(sql + " ORDER BY id LIMIT 1", params).fetchone()
        return None if row is None else self._effect(row)

    # -- fault injection --------------------------------------------------------------------

    def _delay(self) -> None:
        self._check_fork()
        if self.config.latency > 0:
            time.sleep(self.config.latency)

    def _perform(self, operation: str, write: Callable[[sqlite3.Connection], T]) -> T:
        """Run one mutating call: latency, maybe reject, commit, maybe lose the reply."""
        self._delay()
        # Rejection happens before the transaction opens: a FarRejected caller may rely on
        # nothing having been recorded.
        if self._rng.random() < self.config.reject_rate:
            raise FarRejected(f"{self.name}.{operation}: rejected, nothing recorded")
        with self._transaction() as conn:
            result = write(conn)
        # The effect is durable from here on; losing the reply now is what forces callers to
        # reconcile by key instead of blindly retrying.
        if self._rng.random() < self.config.lost_reply_rate:
            raise FarTimeout(f"{self.name}.{operation}: reply lost, effect may have happened")
        return result

    # -- ledger inspection (tests, demo) ----------------------------------------------------

    def effects(self, key: str | None = None) -> list[Effect]:
        """All recorded effects in commit order, optionally only those for ``key``."""
        if key is None:
            rows = self._query("SELECT * FROM effects ORDER BY id")
        else:
            rows = self._query("SELECT * FROM effects WHERE key = ? ORDER BY id", (key,))
        return [self._effect(row) for row in rows]

    def count(self) -> int:
        """Number of recorded effects."""
        return int(self._query("SELECT COUNT(*) FROM effects")[0][0])

    def counts_by_key(self) -> dict[str, int]:
        """Number of effects per key; effects without a key (email) are not included."""
        rows = self._query("SELECT key, COUNT(*) FROM effects WHERE key IS NOT NULL GROUP BY key ORDER BY key")
        return {row[0]: int(row[1]) for row in rows}

    def duplicates(self) -> dict[str, int]:
        """Keys with more than one effect: the double orders/shipments a crash-safe run avoids."""
        rows = self._query(
            "SELECT key, COUNT(*) FROM effects WHERE key IS NOT NULL GROUP BY key HAVING COUNT(*) > 1 ORDER BY key"
        )
        return {row[0]: int(row[1]) for row in rows}

    def reset(self) -> None:
        """Delete every recorded effect (tests and the demo start from an empty ledger)."""
        with self._transaction() as conn:
            conn.execute("DELETE FROM effects")
