"""The Citus lane: `python -m tests.citus.lane [pytest arguments]` starts a private cluster (tests/citus/cluster.py:
a coordinator and two workers), migrates the demo site into it, lays the record out with `manage.py
distribute_runs`, and runs pytest against the coordinator (DATABASE_URL, DURABLERUNS_TEST_CITUS=1: the suite then
uses that database as it is, tests/conftest.py); the cluster is stopped and removed afterwards whatever happens.
Without test paths it runs the lane bin/test runs (DEFAULT, below).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.citus.cluster import citus_cluster  # noqa: E402

# What the lane runs by default (bin/test), kept lean (the whole CI run stays under 45 minutes on 2 cores): the
# Citus tests, the core (tests/unit), the integration tests but the slowest (their timings are of a worker pool,
# not of the record: test_rates, test_pool, test_pickup, test_workers, test_schedule_workers, test_shutdown_grace,
# test_bulk_workers pass on a cluster too), the crash matrix (a worker SIGKILLed at every point of the step cycle)
# and the other fault tests that use the site's database, and tests/ops. `python -m tests.citus.lane
# tests/integration` runs them all; docs/citus.md says what each showed.
# Left out too: test_worker_host.py, whose heartbeat test finds the renewal by its statement's text in
# pg_stat_activity, the single node's one statement; on a cluster the renewal is a transaction of several, and the
# test missed it within 20 s in 1 of 2 CI runs.
DEFAULT = [
    "tests/citus",
    "tests/unit",
    "--deselect",
    "tests/unit/test_typing.py",  # mypy: no database, run by the other lanes
    "tests/integration/test_engine.py",
    "tests/integration/test_children.py",
    "tests/integration/test_deadline.py",
    "tests/integration/test_holdings.py",
    "tests/integration/test_attributes.py",
    "tests/integration/test_commands.py",
    "tests/integration/test_deployed.py",
    "tests/integration/test_restart.py",
    "tests/integration/test_map.py",
    "tests/integration/test_schedules.py",
    "tests/integration/test_measure_loop.py",
    "tests/integration/test_waits.py",
    "tests/integration/test_tracing.py",
    "tests/integration/test_progress.py",
    "tests/integration/test_stopped_for_staff.py",
    "tests/integration/test_test_clock.py",
    "tests/integration/test_bad_input_start.py",
    "tests/integration/test_holdings_missing_step.py",
    "tests/integration/test_connections.py",
    "tests/integration/test_plans_in_process.py",
    "tests/integration/test_limits.py",  # concurrency limits: admitted across the shards, two worker processes
    "tests/integration/test_limits_cancel.py",
    "tests/faults/test_crash_matrix.py::test_a_worker_killed_at_any_point_loses_nothing_and_does_nothing_twice",
    # The crash budget where nothing is recorded: the takeovers counted by the cluster's claim.
    "tests/faults/test_crash_matrix.py::"
    "test_a_chain_of_held_results_that_kills_its_worker_every_time_stops_for_staff_at_the_crash_budget",
    "tests/integration/test_takeovers.py",
    # The fault tests that run against the site's database (those that start private PostgreSQL servers, a
    # PgBouncer, a standby or a network namespace test one node's infrastructure): workers SIGKILLed around child
    # starts, waits and maps, clocks skewed with libfaketime, deploys in flight, bad input, a naive resume.
    "tests/faults/test_bad_input.py",
    "tests/faults/test_child_crashes.py",
    "tests/faults/test_clock_skew.py",
    "tests/faults/test_deploys_in_flight.py",
    "tests/faults/test_map_crash.py",
    "tests/faults/test_naive_resume.py",
    "tests/faults/test_wait_crashes.py",
    # Operations: runs_health (its trigger check on the triggers a cluster keeps), metrics (the finished counter is
    # the finished runs present there), prune (its batch locked shard by shard, skipping runs held elsewhere),
    # alerts, the dashboard. (Not the prune bench's smoke tests: a benchmark's, not the record's.)
    "tests/ops",
    "--deselect",
    "tests/ops/test_bench_prune.py",
    # The back office on a cluster: the escalation queue (its order by what a run holds), the inbox (its count,
    # items, take and release, reminders), bulk acts (the runs list's filters, a bulk decision), and debounced
    # starts through the API. `python -m tests.citus.lane tests/admin tests/api` runs them all (they
    # pass, less one that counts the single-node queries of the runs list: docs/citus.md).
    "tests/admin/test_escalations.py",
    "tests/admin/test_holdings_display.py",
    "tests/admin/test_inbox.py",
    "tests/api/test_inbox.py",
    "tests/admin/test_bulk.py",
    "tests/integration/test_bulk.py",
    "tests/integration/test_inbox_workers.py",  # three --loop workers, one SIGKILLed, read skew across nodes
    "tests/integration/test_debounce.py",  # debounced starts: the key's turn taken on the coordinator
    "tests/api/test_debounce.py",
]


def main(argv: list[str]) -> int:
    started = time.monotonic()
    with citus_cluster() as cluster:
        env = dict(
            os.environ, DATABASE_URL=cluster.url, DURABLERUNS_TEST_CITUS="1", DJANGO_SETTINGS_MODULE="project.settings"
        )
        for command in (["migrate", "--skip-checks", "-v0"], ["distribute_runs", "--skip-checks"]):
            done = subprocess.run(
                [sys.executable, "manage.py", *command], cwd=ROOT, env=env, text=True, capture_output=True, timeout=600
            )
            if done.returncode != 0:
                print(done.stdout, done.stderr, file=sys.stderr)
                return done.returncode
        print(f"Citus cluster ready in {time.monotonic() - started:.1f} s: {cluster.url}", flush=True)
        # Options alone (bin/test's -q --basetemp=...) run the default selection with them.
        chosen = argv if any(not a.startswith("-") for a in argv) else [*DEFAULT, *argv]
        tests = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *chosen], cwd=ROOT, env=env)
    print(f"(the Citus lane took {time.monotonic() - started:.0f} s)", flush=True)
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
