"""Workers behind PgBouncer in transaction pooling: what holds, and what the worker must not pretend.

A private PgBouncer (tests.faults.pgbouncer) stands in front of the test database with fewer server connections
than its clients, so each transaction of a worker may run on another server connection: a statement prepared
on one is unknown on the next, and a LISTEN is left behind on a server connection the pooler hands to others.
The crash matrix's core and a short soak pass through it live beside those tests (test_crash_matrix,
test_soak), with the pooler as their route.
"""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

import durableruns
from durableruns.store import sql
from durableruns.models import RunState, RunStatus, WorkerPresence
from tests.conftest import Workers, database_url, wait_until
from tests.faults.pgbouncer import PgBouncer
from tests.faults.support import spawn
from tests.logs import stray_tracebacks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

DEAF = "polling (notifications do not arrive: "


def presence(name: str) -> WorkerPresence | None:
    return WorkerPresence.objects.filter(name=name).first()


def test_a_connection_through_the_pooler_is_known_for_one_and_prepares_nothing(bouncer: PgBouncer) -> None:
    url = bouncer.url.replace("postgres://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as pooled, psycopg.connect(
            database_url().replace("postgres://", "postgresql://"), autocommit=True) as direct:
        assert sql.through_a_proxy(pooled) and not sql.through_a_proxy(direct)


def test_through_the_pooler_the_worker_says_once_that_it_polls(bouncer: PgBouncer, workers: Workers,
                                                               tmp_path: Path) -> None:
    """Its LISTEN goes through the pooler, where no notification comes back: the start line, the presence row and
    the summary say it polls, and why; runs are still worked (by the poll), with statements unprepared."""
    worker = spawn(workers, tmp_path, "pooled", "--loop", "--interval", "0.5", "--concurrency", "8",
                   DATABASE_URL=bouncer.url)
    wait_until(lambda: worker.out.stat().st_size > 0, timeout=30, what="the start line")
    first = worker.out.read_text().splitlines()[0]
    assert DEAF in first and "DURABLERUNS_LISTEN_DATABASE" in first, first
    wait_until(lambda: presence("pooled") is not None, what="the presence row")
    assert presence("pooled").pickup.startswith(DEAF) and not presence("pooled").listening
    run_ids = [durableruns.start("scripted", {}) for _ in range(40)]
    wait_until(lambda: RunState.objects.filter(pk__in=run_ids, status=RunStatus.COMPLETED).count() == 40,
               timeout=30, what="the runs to be worked by the poll")
    worker.proc.send_signal(signal.SIGTERM)
    worker.proc.wait(timeout=30)
    out, err = worker.output()
    assert worker.proc.returncode == 0 and not stray_tracebacks(err), err
    assert DEAF in out.splitlines()[-1] and "listening" not in out
    assert err.count("notifications do not arrive") == 1  # said once in the log too
    assert "prepared statement" not in err + bouncer.log()


def test_with_a_direct_listen_alias_notifications_wake_a_worker_behind_the_pooler(
        bouncer: PgBouncer, workers: Workers, tmp_path: Path) -> None:
    """DURABLERUNS_LISTEN_DATABASE names an alias that reaches PostgreSQL directly: the worker listens there while
    every fact goes through the pooler, and a new run is worked long before its 30 s poll."""
    worker = spawn(workers, tmp_path, "split", "--loop", "--interval", "30", "--concurrency", "2",
                   DATABASE_URL=bouncer.url, LISTEN_DATABASE_URL=database_url())
    wait_until(lambda: worker.out.stat().st_size > 0, timeout=30, what="the start line")
    first = worker.out.read_text().splitlines()[0]
    assert "listening on durableruns_due (database alias 'listen')" in first, first
    wait_until(lambda: presence("split") is not None and presence("split").listening, what="the presence row")
    run_id = durableruns.start("scripted", {})
    wait_until(lambda: RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED, timeout=10,
               what="the new run to be picked up by its notification")
    worker.proc.send_signal(signal.SIGTERM)
    worker.proc.wait(timeout=30)
    out, err = worker.output()
    assert worker.proc.returncode == 0 and not stray_tracebacks(err), err
    assert "listening on durableruns_due" in out.splitlines()[-1] and DEAF not in out
