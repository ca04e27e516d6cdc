"""DURABLERUNS_LISTEN: on by default an idle --loop worker on PostgreSQL listens for new work; off, it polls only.

The benchmarks' degraded pickup figure relies on it; here a real worker process, started with each value, says
how it picks work up, and PostgreSQL shows whether a backend LISTENs.
"""

from __future__ import annotations

import pytest

from durableruns import conf
from tests.conftest import wait_until
from tests.integration.test_pickup import admin_connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def listening_backends() -> int:
    return admin_connection().execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN durableruns_due'"
    ).fetchone()[0]


def first_line(worker) -> str:
    line = worker.stdout.readline()
    assert "working" in line, line
    return line


def test_the_setting_defaults_to_listening(settings):
    assert conf.listen() is True
    settings.DURABLERUNS_LISTEN = False
    assert conf.listen() is False


@pytest.mark.parametrize(("value", "listens"), [("1", True), ("0", False)])
def test_a_loop_worker_listens_only_when_the_setting_allows(workers, value, listens):
    # It stops by itself (--max-seconds), so the test does not depend on how fast an idle worker heeds SIGTERM.
    worker = workers.start("--loop", "--interval", "30", "--concurrency", "2", "--max-seconds", "8",
                           DJANGO_SETTINGS_MODULE="bench.settings", DURABLERUNS_LISTEN=value)
    line = first_line(worker)
    if listens:
        assert "listening on durableruns_due" in line
        wait_until(lambda: listening_backends() == 1, what="the worker's LISTEN")
    else:
        assert "listening" not in line and "polling every 30s" in line
        assert listening_backends() == 0
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert ("listening on durableruns_due" in out) is listens  # the summary line says it too
