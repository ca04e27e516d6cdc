"""A real worker process and what its host brings: a connection killed under its heartbeat, a skewed clock."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from durableruns.models import RunState, RunStatus, RunStep
from tests.conftest import wait_until
from tests.factories import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def skewed(offset: str) -> dict[str, str]:
    """The environment that runs a worker with its wall clock moved by `offset` (libfaketime), monotonic time
    left alone."""
    if not LIBFAKETIME.exists():
        pytest.fail(f"{LIBFAKETIME} is missing: bin/setup --services installs Debian's faketime package")
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": offset, "DONT_FAKE_MONOTONIC": "1"}


def test_the_heartbeat_reconnects_after_its_connection_is_killed(far, workers):
    run_id = make_run("heartbeat_probe")
    db = settings.DATABASES["default"]
    with psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"] or "postgres",
                         dbname=connection.settings_dict["NAME"], autocommit=True) as admin:
        # Only the holder's backends, opened after this moment: one of an earlier test's workers, just stopped, may
        # still be listed with a statement of its own that mentions leases.
        (before,) = admin.execute("SELECT clock_timestamp()").fetchone() or (None,)
        holder = workers.start("--once", "--lease", "2", "--worker", "holder", TEST_HOLD_SECONDS="5")
        wait_until(lambda: far.email.count() == 1, what="the step to act and start holding")

        def heartbeat_backends() -> list[int]:
            # The renewal is the one statement that extends a lease without claiming or inserting anything.
            rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                 "AND pid <> pg_backend_pid() AND backend_start > %s "
                                 "AND query LIKE '%%lease_expires_at%%' "
                                 "AND query NOT LIKE '%%claimed%%' AND query NOT LIKE '%%INSERT%%'",
                                 [before]).fetchall()
            return [pid for (pid,) in rows]

        wait_until(lambda: heartbeat_backends() != [], what="the heartbeat's first renewal")
        [pid] = heartbeat_backends()
        admin.execute("SELECT pg_terminate_backend(%s::int)", [pid])  # ::int: Citus adds an overload
    # A worker ready to take the run the moment the lease runs out.
    taker = workers.start("--loop", "--lease", "2", "--interval", "0.1", "--worker", "taker", TEST_HOLD_SECONDS="0")
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert "reconnecting for the next beat" in err, err
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED and run.owner.startswith("holder#")
    assert list(RunStep.objects.filter(run_id=run_id).values_list("attempt", "status")) == [(1, "completed")]
    assert far.email.count() == 1  # the taker never ran the step a second time
    taker.kill()


def test_a_worker_whose_clock_is_far_off_warns_and_still_works(far, workers):
    run_id = make_run("scripted")
    ahead = workers.run("--once", "--lease", "30", **skewed("+120s"))
    assert ahead.returncode == 0, ahead.stderr
    assert "this host's clock is 1" in ahead.stderr and "s ahead of the database's" in ahead.stderr, ahead.stderr
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    behind = workers.run("--once", "--lease", "30", **skewed("-120s"))
    assert behind.returncode == 0 and "behind the database's" in behind.stderr, behind.stderr
    in_step = workers.run("--once", "--lease", "30")
    assert in_step.returncode == 0 and "clock" not in in_step.stderr, in_step.stderr
