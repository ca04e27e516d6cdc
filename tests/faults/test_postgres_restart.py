"""PostgreSQL restarted in the middle of a pass: the worker stops with a clear message, nothing is half recorded,
and the next pass completes the runs with one effect per key.

The shared server on 5432 is never touched: the test starts a private PostgreSQL in a temporary folder on a free
port (tests/faults/pg_instance.py), migrates it, and restarts that one.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest

from project.purchasing.far import FarSystems
from tests.conftest import wait_until
from tests.faults.pg_instance import PrivatePostgres, manage
from tests.faults.pg_instance import private_postgres as running_postgres
from tests.faults.support import PLAN, SYSTEM_OF, duplicates, reference
from tests.logs import stray_tracebacks

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

RUNS = 6
LINES = 40  # priced at 50 ms each: 2 s of quote per run, checkpointed at line 25


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL of this test's own, migrated; stopped and removed afterwards whatever happens."""
    with running_postgres() as pg:
        yield pg


def assert_whole_facts(pg: PrivatePostgres) -> dict[str, str]:
    """Every row is a whole fact; each run's cursor sits right after its completed steps. Returns statuses."""
    half = pg.query("SELECT run_id, step, attempt, status FROM run_step WHERE "
                    "(status = 'completed' AND (result IS NULL OR finished_at IS NULL)) OR "
                    "(status = 'started' AND (result IS NOT NULL OR finished_at IS NOT NULL))")
    assert half == [], f"half-recorded attempts: {half}"
    runs = dict((r, (status, cursor)) for r, status, cursor in pg.query("SELECT run_id, status, cursor FROM run_state"))
    latest: dict[str, dict[str, str]] = {r: {} for r in runs}
    for run_id, step, status in pg.query("SELECT run_id, step, status FROM run_step ORDER BY run_id, step, attempt"):
        latest[run_id][step] = status
    for run_id, (status, cursor) in runs.items():
        done = [s for s in PLAN if latest[run_id].get(s) == "completed"]
        assert tuple(done) == PLAN[: len(done)] and cursor == len(done), (run_id, status, cursor, latest[run_id])
        in_doubt = [s for s, st in latest[run_id].items() if st == "started"]
        assert in_doubt in ([], [PLAN[cursor]] if cursor < len(PLAN) else []), (run_id, cursor, in_doubt)
        assert (status == "completed") == (cursor == len(PLAN)), (run_id, status, cursor)
    return {r: s for r, (s, _) in runs.items()}


@pytest.mark.parametrize("mode", ["fast", "immediate"])  # a clean shutdown, and a crash with WAL recovery
def test_a_database_restart_mid_pass_stops_the_worker_cleanly_and_the_next_pass_finishes(
    private_postgres: PrivatePostgres, far: FarSystems, mode: str
) -> None:
    pg = private_postgres
    inputs = {f"PO-restart-{i}": {"reference": reference(300 + i), "buyer": "Harbour Foods", "line_count": LINES}
              for i in range(RUNS)}
    starter = manage(pg, "shell", "-c", "import json, durableruns\n"
                     f"for run_id, data in json.loads({json.dumps(json.dumps(inputs))}).items():\n"
                     "    durableruns.start('purchase_order', data, run_id=run_id)\n")
    out, err = starter.communicate(timeout=60)
    assert starter.returncode == 0, err

    # A pass over the runs, restarted while the second run's quote is past its checkpoint at line 25: the
    # heartbeat thread (every lease/3) meets the lost connection before the step's next write does.
    # One thread: the runs go one after another, so the test knows which one the restart catches mid-step.
    worker = manage(pg, "resume_runs", "--skip-checks", "--loop", "--interval", "0.1", "--lease", "1",
                    "--concurrency", "1", PURCHASING_QUOTE_ITEM_SECONDS="0.05")
    try:
        wait_until(lambda: pg.query("SELECT loop_cursor FROM run_step WHERE run_id = 'PO-restart-1' "
                                    "AND step = 'quote'") == [(25,)], timeout=60, what="the second quote's checkpoint")
        assert worker.poll() is None
        pg.pg_ctl("-m", mode, "-w", "restart")  # every open connection is terminated
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.communicate()

    # The worker stopped by itself, non-zero, with one clear message and no traceback.
    assert worker.returncode == 1, (worker.returncode, out, err)
    assert "database error, pass stopped" in err and "nothing is half recorded" in err, err
    assert not stray_tracebacks(err) and "Exception in thread" not in err, err

    statuses = assert_whole_facts(pg)
    assert statuses["PO-restart-0"] == "completed" and statuses["PO-restart-1"] == "running", statuses
    assert set(statuses.values()) <= {"completed", "running", "pending"}, statuses

    # The next pass (once the dead pass's lease has run out) completes every run, each effect once.
    time.sleep(1.1)
    again = manage(pg, "resume_runs", "--skip-checks", "--lease", "1")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and not stray_tracebacks(err), out + err
    statuses = assert_whole_facts(pg)
    assert set(statuses.values()) == {"completed"}, (statuses, out)
    assert duplicates(far) == {}
    for step, system in SYSTEM_OF.items():
        assert getattr(far, system).counts_by_key() == {f"PO-restart-{i}:{step}": 1 for i in range(RUNS)}
    assert far.email.count() == RUNS
