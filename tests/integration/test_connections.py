"""The timeouts durableruns sets on its PostgreSQL connections: they reach libpq, and a site's own value wins.

A worker cut off from PostgreSQL must give up within about one lease instead of hanging on a dead socket, so
the app fills connect_timeout, TCP keepalives and tcp_user_timeout into each PostgreSQL alias's OPTIONS at
start-up. What is checked here is what the connection really negotiated (psycopg's `info.get_parameters()`
shows the conninfo libpq used), in this process and in a fresh `manage.py` process, as a site configures it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from durableruns import conf, connections
from tests.conftest import ROOT, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Prints the conninfo parameters of a real connection opened by a fresh site process.
PRINT_PARAMETERS = (
    "import json; from django.db import connection; connection.ensure_connection(); "
    "print(json.dumps(connection.connection.info.get_parameters()))"
)


def site_parameters(url: str, **env: str) -> dict[str, str]:
    """The libpq parameters of the first connection a `manage.py shell` opens with DATABASE_URL=url."""
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", PRINT_PARAMETERS], cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="project.settings", **env), timeout=60,
    )
    assert done.returncode == 0, done.stderr
    parameters: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return parameters


def test_the_defaults_follow_the_lease_so_a_cut_off_worker_gives_up_within_about_one():
    thirty = connections.timeouts_for(30)
    assert thirty == {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 3,
                      "keepalives_count": 3, "tcp_user_timeout": 20000}
    two = connections.timeouts_for(2)
    # libpq counts connect_timeout and keepalives in whole seconds (a connect_timeout under 2 means 2).
    assert two["connect_timeout"] == 2 and two["keepalives_idle"] == 1 and two["keepalives_interval"] == 1
    assert two["tcp_user_timeout"] == 1333
    for lease in (2, 5, 30, 300):
        t = connections.timeouts_for(lease)
        # Unacknowledged data gives up before the lease runs out; an idle socket's probes end within a lease.
        assert t["tcp_user_timeout"] < lease * 1000
        assert t["keepalives_idle"] + t["keepalives_interval"] * t["keepalives_count"] <= max(lease, 4)


def test_the_options_land_on_the_test_process_connection():
    connections.apply_timeouts()  # as ready() did (an in-process resume_runs --lease may have re-derived them)
    connection.close()
    connection.ensure_connection()
    parameters = connection.connection.info.get_parameters()
    expected = connections.timeouts_for(conf.lease_seconds())
    for name, value in expected.items():
        assert parameters.get(name) == str(value), (name, parameters)


def test_resume_runs_derives_them_from_its_own_lease():
    try:
        call_command("resume_runs", "--lease", "3", stdout=StringIO(), stderr=StringIO())
        assert connection.settings_dict["OPTIONS"]["tcp_user_timeout"] == 2000
        connection.close()
        connection.ensure_connection()
        assert connection.connection.info.get_parameters()["tcp_user_timeout"] == "2000"
    finally:
        connections.apply_timeouts()
        connection.close()


def test_a_fresh_site_process_connects_with_them():
    parameters = site_parameters(database_url(), DURABLERUNS_LEASE_SECONDS="6")
    assert parameters["tcp_user_timeout"] == "4000" and parameters["connect_timeout"] == "2", parameters
    assert parameters["keepalives"] == "1" and parameters["keepalives_idle"] == "2", parameters


def test_a_site_own_options_win_over_the_defaults():
    # django-environ turns a DATABASE_URL's query into OPTIONS: the site's own settings, as a deployment has them.
    url = database_url() + "?tcp_user_timeout=45000&keepalives_idle=7"
    parameters = site_parameters(url, DURABLERUNS_LEASE_SECONDS="6")
    assert parameters["tcp_user_timeout"] == "45000" and parameters["keepalives_idle"] == "7", parameters
    assert parameters["connect_timeout"] == "2" and parameters["keepalives_count"] == "3", parameters


def scratch_databases() -> dict[str, dict[str, Any]]:
    return {
        "default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x", "OPTIONS": {"connect_timeout": 9}},
        "replica": {"ENGINE": "django.db.backends.postgresql", "NAME": "y"},
        "local": {"ENGINE": "django.db.backends.sqlite3", "NAME": "z.sqlite3"},
    }


def test_apply_fills_each_postgresql_alias_and_leaves_other_engines_alone():
    databases = scratch_databases()
    applied = connections.apply_timeouts(databases, lease_seconds=30)
    assert applied == ["default", "replica"]
    assert databases["default"]["OPTIONS"] == {**connections.timeouts_for(30), "connect_timeout": 9}
    assert databases["replica"]["OPTIONS"] == connections.timeouts_for(30)
    assert "OPTIONS" not in databases["local"]


@override_settings(DURABLERUNS_CONNECTION_TIMEOUTS=False)
def test_the_setting_turns_it_off():
    databases = scratch_databases()
    assert connections.enabled() is False
    assert connections.apply_timeouts(databases, lease_seconds=30) == []
    assert databases["default"]["OPTIONS"] == {"connect_timeout": 9} and "OPTIONS" not in databases["replica"]


def test_the_options_are_set_on_the_dict_django_connects_with():
    # Django's ConnectionHandler keeps the settings' own dicts: what ready() set is what a new connection reads.
    from django.db import connections as handler

    connections.apply_timeouts()
    assert handler["default"].settings_dict["OPTIONS"]["tcp_user_timeout"] == (
        connections.timeouts_for(conf.lease_seconds())["tcp_user_timeout"]
    )


def test_a_second_call_for_another_lease_replaces_only_its_own_defaults():
    # resume_runs --lease 2 re-derives them for its own lease: the site's value still stands.
    databases = scratch_databases()
    connections.apply_timeouts(databases, lease_seconds=30)
    connections.apply_timeouts(databases, lease_seconds=2)
    assert databases["replica"]["OPTIONS"] == connections.timeouts_for(2)
    assert databases["default"]["OPTIONS"] == {**connections.timeouts_for(2), "connect_timeout": 9}


def test_resume_runs_says_the_database_is_unreachable_and_the_next_pass_resumes():
    # Nothing listens on port 1: the connection is refused, as a host's would be while its database is down.
    done = subprocess.run(
        [sys.executable, "manage.py", "resume_runs", "--skip-checks"], cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, DATABASE_URL="postgres://postgres@127.0.0.1:1/nowhere",
                 DJANGO_SETTINGS_MODULE="project.settings"), timeout=60,
    )
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "database error, pass stopped: the database is unreachable or dropped the connection" in done.stderr
    assert "the next pass resumes from the record" in done.stderr and "Traceback" not in done.stderr
