"""Whether a failover could lose a commit PostgreSQL acknowledged: read from the server's replication settings.

Every promise durableruns makes rests on an acknowledged intent commit surviving. With streaming standbys that
acknowledge nothing (asynchronous replication, the default of most managed services), a standby promoted after
the primary dies may lack the last commits: an escalate step whose intent was lost comes back as never started
and runs again without anyone being asked. `resume_runs` (at start) and `runs_health` read what the server says
and warn, once, with the fix. Where the standbys are not visible (a managed service that hides them), nothing is
said: durableruns cannot know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import connections

from durableruns import conf

_READ = """
SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
       coalesce((SELECT json_agg(json_build_array(application_name, sync_state) ORDER BY application_name)
                   FROM pg_stat_replication WHERE state = 'streaming'), '[]')
"""


@dataclass(frozen=True, kw_only=True)
class Replication:
    synchronous_commit: str
    synchronous_standby_names: str
    standbys: tuple[tuple[str, str], ...]  # (application_name, sync_state) of each streaming standby
    standby_intents: str | None  # DURABLERUNS_STANDBY_INTENTS

    def risk(self) -> str | None:
        """What a failover could lose, with the fix; None when no acknowledged commit could be lost."""
        if not self.standbys:
            return None
        names = ", ".join(f"{name} ({state})" for name, state in self.standbys)
        # A named standby that is not connected makes commits wait (hang), not get lost: not this warning's case.
        if not self.synchronous_standby_names.strip():
            return (
                f"a failover could lose acknowledged commits: PostgreSQL streams to {names} but waits for none of "
                f"them before it acknowledges a commit (synchronous_standby_names is empty). A promoted standby "
                f"may lack the last intents and results: an escalate step whose intent was lost runs again without "
                f"anyone being asked. Fix: set "
                f"synchronous_standby_names (e.g. 'ANY 1 ({', '.join(name for name, _ in self.standbys)})') with "
                f"synchronous_commit = on; or, to protect only the steps with no key or lookup, set it with "
                f"synchronous_commit = local and DURABLERUNS_STANDBY_INTENTS = 'on'."
            )
        if self.synchronous_commit in ("off", "local") and self.standby_intents is None:
            return (
                f"a failover could lose acknowledged commits: synchronous_commit is {self.synchronous_commit}, so "
                f"commits do not wait for the synchronous standby ({names}). An escalate step whose intent was "
                f"lost runs again without anyone being asked. Fix: synchronous_commit = on, or "
                f"DURABLERUNS_STANDBY_INTENTS = 'on' so the intents of steps with no key or lookup wait for it."
            )
        return None


def read(alias: str | None = None) -> Replication | None:
    """The replication settings as the runs' database (or `alias`) sees them; None off PostgreSQL."""
    connection = connections[alias or conf.database()]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(_READ)
        commit, names, standbys = cursor.fetchone()
    if isinstance(standbys, str):
        standbys = json.loads(standbys)
    return Replication(
        synchronous_commit=commit,
        synchronous_standby_names=names,
        standbys=tuple((str(name), str(state)) for name, state in standbys),
        standby_intents=conf.standby_intents(),
    )


def risk_now() -> str | None:
    """The warning for the runs' database now, if a failover could lose an acknowledged commit."""
    state = read()
    return None if state is None else state.risk()
