"""A site that keeps durableruns in a database of its own: SQLite as "default" (the site's own data: users,
sessions, the admin's log) and PostgreSQL as "runs" (every table, claim, lock and LISTEN of durableruns).

The processes tests/site/test_two_databases.py starts (migrate, resume_runs, tests/site/two_databases_steps.py)
use it, with both databases named in the environment: SITE_DATABASE_URL and RUNS_DATABASE_URL.
"""

from __future__ import annotations

from typing import Any

from project.settings import *  # noqa: F403
from project.settings import env


class SiteRouter:
    """The site's own router: its apps' tables in "default" only (so "runs" holds durableruns' alone)."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return None if app_label == "durableruns" else db == "default"


DATABASES = {
    "default": env.db("SITE_DATABASE_URL"),
    "runs": env.db("RUNS_DATABASE_URL"),
}
DURABLERUNS_DATABASE = "runs"
DATABASE_ROUTERS = ["durableruns.routers.DurableRunsRouter", "tests.site.two_databases.SiteRouter"]
