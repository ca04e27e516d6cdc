"""Set up SQLite connections so a worker and the site can share the file without "database is locked".

Django opens SQLite with a 5 s busy timeout, in rollback-journal mode, and starts transactions DEFERRED. The
store's transactions read and then write; two DEFERRED ones that both read cannot both upgrade to a write, and
SQLite refuses the second at once (SQLITE_BUSY, whatever the timeout), so a `--loop` worker beside a site
calling start() dies after a few runs. On each new SQLite connection, unless the site's OPTIONS already say:
- transactions begin IMMEDIATE (the write lock is taken at BEGIN, so a transaction waits instead of failing),
- PRAGMA busy_timeout waits up to DURABLERUNS_SQLITE_BUSY_TIMEOUT_SECONDS for the lock,
- PRAGMA journal_mode=WAL lets readers go on while one writer writes (a property of the file; not for :memory:).
DURABLERUNS_SQLITE_TUNING = False leaves connections as the site configured them.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Warning

from durableruns import conf


def tune_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """connection_created receiver: apply what the module docstring lists to a new SQLite connection."""
    if connection.vendor != "sqlite" or not conf.sqlite_tuning():
        return
    options = connection.settings_dict.get("OPTIONS") or {}
    if options.get("transaction_mode") is None and connection.transaction_mode is None:
        connection.transaction_mode = "IMMEDIATE"
    cursor = connection.connection.cursor()
    try:
        if "timeout" not in options:
            cursor.execute(f"PRAGMA busy_timeout = {conf.sqlite_busy_timeout_ms():d}")
        if not connection.is_in_memory_db():
            cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def check_sqlite_options(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """With DURABLERUNS_SQLITE_TUNING off, say exactly which OPTIONS a SQLite database still lacks."""
    if conf.sqlite_tuning():
        return []
    messages: list[CheckMessage] = []
    for alias, database in settings.DATABASES.items():
        if not database.get("ENGINE", "").endswith("sqlite3"):
            continue
        options = database.get("OPTIONS") or {}
        missing = []
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            missing.append('"transaction_mode": "IMMEDIATE"')
        if "timeout" not in options:
            missing.append('"timeout": 30')
        if "journal_mode=wal" not in str(options.get("init_command", "")).lower().replace(" ", ""):
            missing.append('"init_command": "PRAGMA journal_mode=WAL;"')
        if missing:
            messages.append(
                Warning(
                    f"SQLite database {alias!r} is set up neither by durableruns (DURABLERUNS_SQLITE_TUNING is off) "
                    "nor by its OPTIONS: a worker beside the site will stop with 'database is locked'.",
                    hint=f"Add to DATABASES[{alias!r}]['OPTIONS']: {', '.join(missing)}.",
                    id="durableruns.W101",
                )
            )
    return messages
