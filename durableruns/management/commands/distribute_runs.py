"""Lay the runs' record out over a Citus cluster (docs/citus.md): run once on the coordinator after `migrate`."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from durableruns import conf, distribution


class Command(BaseCommand):
    help = (
        "On a site whose runs database (DURABLERUNS_DATABASE) is a Citus coordinator: distribute the run tables by "
        "run_id, co-located, and make run_plan a reference table (docs/citus.md). Idempotent: a second call says "
        "there is nothing to do. Refuses, changing nothing, on a database without Citus."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        using = conf.database()
        version = distribution.citus_version(using)
        if version is None:
            raise CommandError(
                f"the runs database ({using!r}) is not a Citus coordinator (no citus extension): nothing changed. "
                "distribute_runs lays the record out over a Citus cluster; a single PostgreSQL needs nothing.")
        started = time.monotonic()
        try:
            layout = distribution.distribute(using)
        except DatabaseError as exc:
            raise CommandError(f"Citus refused the layout: {str(exc).strip()}") from None
        if not layout.moves:
            self.stdout.write(f"the record is already distributed (Citus {version}): nothing to do")
            return
        for move in layout.moves:
            self.stdout.write(move)
        self.stdout.write(f"distributed over Citus {version} in {time.monotonic() - started:.1f} s")
