"""A site with durableruns in a database of its own (DURABLERUNS_DATABASE = "runs", DurableRunsRouter): SQLite as
"default" for the site's own data, PostgreSQL as "runs".

Real processes of that site (tests/site/two_databases.py) do the work, as a deploy would: migrate both databases,
start runs (tests/site/two_databases_steps.py), work them with `manage.py resume_runs --once`, and serve the admin
and the API to a staff member. The test reads both databases from outside: durableruns' tables are in "runs" only,
and so is every fact of every run.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import environ
import pytest
from django.apps import apps

from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

# Every table durableruns' migrations make.
TABLES = sorted(model._meta.db_table for model in apps.get_app_config("durableruns").get_models())


@dataclass
class Site:
    env: dict[str, str]
    sqlite: Path
    runs: dict[str, Any]  # psycopg's connection keywords of the runs' database
    started: dict[str, Any] = field(default_factory=dict)  # what the start step found

    def python(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def steps(self, *names: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.python("-m", "tests.site.two_databases_steps", *names).stdout)
        return found

    def runs_query(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(**self.runs, autocommit=True) as conn:
            return list(conn.execute(sql).fetchall())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """The site's two databases, made and migrated as its deploy would (`migrate`, then `migrate --database runs`),
    and its first runs started (two_databases_steps.start), in one process of the site."""
    import psycopg

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("needs PostgreSQL (set DATABASE_URL=postgres://...)")
    main = environ.Env.db_url_config(url)
    name = f"{main['NAME']}_runs"
    server = {
        "host": main["HOST"] or "127.0.0.1",
        "port": int(main["PORT"] or 5432),
        "user": main["USER"] or "postgres",
    }
    if main["PASSWORD"]:
        server["password"] = main["PASSWORD"]
    with psycopg.connect(**server, dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    sqlite = tmp_path_factory.mktemp("site") / "site.sqlite3"
    credentials = f"{server['user']}:{main['PASSWORD']}" if main["PASSWORD"] else server["user"]
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.site.two_databases",
        PYTHONUNBUFFERED="1",
        SITE_DATABASE_URL=f"sqlite:///{sqlite}",
        RUNS_DATABASE_URL=f"postgres://{credentials}@{server['host']}:{server['port']}/{name}",
        DURABLERUNS_WORKFLOW_MODULES="tests.workflows",
    )
    env.pop("LISTEN_DATABASE_URL", None)
    made = Site(env=env, sqlite=sqlite, runs={**server, "dbname": name})
    made.started = made.steps("migrate", "start")["start"]  # one process: a Django start-up less
    yield made
    with psycopg.connect(**server, dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def started(site: Site) -> dict[str, Any]:
    return site.started


@pytest.fixture(scope="module")
def worked(site: Site, started: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """One cron pass of a real worker process, with its start-up checks."""
    return site.python("manage.py", "resume_runs", "--once")


@pytest.fixture(scope="module")
def staffed(site: Site, worked: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return site.steps("staff")["staff"]


def test_migrate_puts_the_tables_of_durableruns_in_runs_and_none_in_default(site: Site):
    with sqlite3.connect(site.sqlite) as db:
        in_default = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "auth_user" in in_default and "django_session" in in_default  # the site's own data stays there
    assert not in_default & set(TABLES)
    in_runs = {row[0] for row in site.runs_query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    # Only durableruns' (the site's router keeps its own apps off "runs", and durableruns' migrations need no user
    # table there: migration 0017); the caller's orders are the start step's.
    assert in_runs == {*TABLES, "django_migrations", "site_order"}
    applied = {row[0] for row in site.runs_query("SELECT name FROM django_migrations WHERE app = 'durableruns'")}
    assert "0001_initial" in applied and "0017_intervention_user_no_constraint" in applied


def test_start_inside_atomic_on_runs_is_one_commit_with_the_callers_records(started: dict[str, Any]):
    assert started["orders"] == ["order-committed"]
    assert "in-runs-committed" in started["runs"]
    assert "in-runs-rolled-back" not in started["runs"]  # rolled back with the caller's order


def test_start_inside_atomic_on_default_only_is_committed_on_its_own(started: dict[str, Any]):
    """Two databases, no shared commit: the caller's user rolled back, the run it started did not."""
    assert "rolled-back" not in started["users"]
    assert "in-default-rolled-back" in started["runs"]


def test_the_checks_warn_without_the_router_and_refuse_an_unknown_alias(started: dict[str, Any]):
    assert started["checks"]["as_set_up"] == []  # nor W001: the runs' database is PostgreSQL, whatever "default" is
    assert started["checks"]["without_the_router"] == ["durableruns.W004"]
    assert started["checks"]["an_unknown_alias"] == ["durableruns.E007"]


def test_a_worker_process_completes_the_runs_in_the_runs_database(site: Site, worked: subprocess.CompletedProcess[str]):
    assert "durableruns." not in worked.stderr, worked.stderr  # its start-up checks said nothing
    statuses = dict(site.runs_query("SELECT run_id, status FROM run_state"))
    assert statuses == {
        "plain-1": "completed",
        "in-runs-committed": "completed",
        "in-default-rolled-back": "completed",
        "escalates-1": "needs_decision",
    }
    steps = site.runs_query("SELECT step, status FROM run_step WHERE run_id = 'plain-1' ORDER BY started_at")
    assert steps == [("first", "completed"), ("second", "completed"), ("third", "completed")]


def test_staff_use_the_admin_and_the_api_on_runs_kept_in_another_database(staffed: dict[str, Any]):
    for url, page in staffed["pages"].items():
        assert page == {"status": 200, "names_a_run": True}, url
    assert (staffed["cancel"], staffed["decide"]) == (200, 200)
    assert staffed["statuses"] == {"cancel-me": "cancelled", "escalates-1": "pending"}
    assert staffed["decided_by_user"] == "root"  # the intervention's user, read from "default"
    # The user deleted in "default": each staff act keeps who did it.
    assert staffed["interventions"] == [["cancel", staffed["user_id"]], ["happened", staffed["user_id"]]]


def test_a_loop_worker_listens_on_the_runs_database_and_takes_a_new_run_at_once(
    site: Site, worked: subprocess.CompletedProcess[str]
):
    """A --loop worker of the site LISTENs on the runs' alias (PostgreSQL; "default" is SQLite): a run started by
    another process is taken on its commit's notification, long before the worker's 60 s poll."""
    loop = subprocess.Popen(
        [sys.executable, "manage.py", "resume_runs", "--loop", "--interval", "60"],
        cwd=ROOT,
        env=site.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert loop.stdout is not None
        assert select.select([loop.stdout], [], [], 120)[0], "the worker wrote nothing in 120 s"
        first = loop.stdout.readline()
        assert "listening on durableruns_due" in first and "alias" not in first, first
        started = time.monotonic()
        assert site.steps("start_later")["start_later"] == {"run_id": "loop-1"}
        while site.runs_query("SELECT status FROM run_state WHERE run_id = 'loop-1'") != [("completed",)]:
            assert time.monotonic() - started < 30, "the new run was not taken at once"
            time.sleep(0.05)
    finally:
        loop.send_signal(signal.SIGTERM)
        _out, err = loop.communicate(timeout=60)
    assert loop.returncode == 0 and "Traceback" not in err, err[-4000:]
