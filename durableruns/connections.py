"""Timeouts on the PostgreSQL connections a worker uses, so that a host cut off from the database gives up.

Without them a worker whose packets vanish (a partition, a dead switch, a firewall dropping silently) waits on
its socket for as long as the kernel retransmits, about fifteen minutes on Linux, while another host has long
taken its runs over. durableruns therefore fills these libpq parameters into the OPTIONS of every PostgreSQL
alias at start-up (psycopg passes OPTIONS through as conninfo), derived from the lease so that a cut-off worker
errors out within about one lease, and the command exits 1 for the next cron pass to resume:

    connect_timeout      a third of the lease (libpq: whole seconds, at least 2)
    keepalives           on; keepalives_idle a third of the lease, keepalives_interval a ninth, keepalives_count 3,
                         so an idle socket whose peer vanished is found out
    tcp_user_timeout     two thirds of the lease, in ms: data the kernel sent that stays unacknowledged that
                         long errors the socket (the heartbeat writes every third of a lease, so it meets it)

A value the site sets itself in DATABASES[alias]["OPTIONS"] wins (including through a DATABASE_URL's query).
DURABLERUNS_CONNECTION_TIMEOUTS = False leaves every alias as configured. None of them touches a Unix socket's
connection, and the server's own timeouts (statement_timeout and the like) are never changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from durableruns import conf

# The engines whose DatabaseWrapper speaks libpq through psycopg (vendor "postgresql").
POSTGRESQL_ENGINES = frozenset(
    {
        "django.db.backends.postgresql",
        "django.contrib.gis.db.backends.postgis",
    }
)


def enabled() -> bool:
    """Whether durableruns sets its connection timeouts; DURABLERUNS_CONNECTION_TIMEOUTS, True by default."""
    return bool(getattr(settings, "DURABLERUNS_CONNECTION_TIMEOUTS", True))


def timeouts_for(lease_seconds: float) -> dict[str, int]:
    """The libpq timeouts for a worker holding leases of `lease_seconds`: it gives up within about one lease.

    The lease is renewed every third of it; the last renewal before a cut can be that old, so the socket must
    error no later than two thirds of a lease after the next write for the worker to stop about when its lease
    runs out and another host takes the run.
    """
    third = lease_seconds / 3
    return {
        "connect_timeout": max(2, math.ceil(third)),
        "keepalives": 1,
        "keepalives_idle": max(1, math.floor(third)),
        "keepalives_interval": max(1, math.floor(lease_seconds / 9)),
        "keepalives_count": 3,
        "tcp_user_timeout": max(1000, int(lease_seconds * 2000 / 3)),
    }


def is_postgresql(database: Mapping[str, Any]) -> bool:
    engine = str(database.get("ENGINE", ""))
    return engine in POSTGRESQL_ENGINES or engine.endswith(".postgresql")


def apply_timeouts(
    databases: dict[str, dict[str, Any]] | None = None, *, lease_seconds: float | None = None
) -> list[str]:
    """Fill the timeouts into each PostgreSQL alias's OPTIONS where the site set none; return those aliases.

    `databases` defaults to Django's own connection settings: the very dicts each new connection reads, so
    a connection opened after this call (in any thread) carries them. One already open keeps its own until
    it reconnects. The site's values are never overwritten.
    """
    if not enabled():
        return []
    if databases is None:
        from django.db import connections

        databases = connections.settings  # the same dicts as settings.DATABASES, with Django's defaults
    timeouts = timeouts_for(conf.lease_seconds() if lease_seconds is None else lease_seconds)
    applied = []
    for alias, database in databases.items():
        if not is_postgresql(database):
            continue
        options = database.setdefault("OPTIONS", {})
        ours = _ours(options)
        for name, value in timeouts.items():
            # A value is the site's unless this module put it there (a second call, for another lease, may
            # replace its own earlier defaults, never what the site wrote).
            if name not in options or (name in ours and options[name] == ours[name]):
                options[name] = ours[name] = value
        applied.append(alias)
    return applied


# The values this module filled in, with the OPTIONS dict they went into (held, so compared by identity).
_filled: list[tuple[dict[str, Any], dict[str, int]]] = []


def _ours(options: dict[str, Any]) -> dict[str, int]:
    for held, filled in _filled:
        if held is options:
            return filled
    _filled.append((options, {}))
    return _filled[-1][1]


def plain_params(alias: str) -> dict[str, Any]:
    """What Django would connect `alias` with (host, credentials, the site's OPTIONS, durableruns' timeouts), for
    a plain psycopg connection outside Django's per-thread handling, which prepares nothing (a pooler may sit
    between): the worker's listener and durableruns.result() LISTEN on one."""
    from django.db import connections

    params = dict(connections[alias].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool"):
        params.pop(django_only, None)
    params["prepare_threshold"] = None
    return params
