"""distribute_runs on a site that already holds runs (docs/citus.md, "A site with data"), on a cluster of its own:
the lane's cluster was laid out before its tests began, so what the first layout does to runs in flight is
tested on a fresh one (a coordinator and one worker, to keep it quick)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from durableruns.limits import PARKED
from tests.citus.cluster import citus_cluster
from tests.conftest import ROOT

pytestmark = pytest.mark.postgres


def test_runs_parked_by_a_limit_before_the_layout_are_pending_after_it_and_a_worker_finishes_them() -> None:
    """A run parked by its concurrency limit waits for a trigger that distribute_runs drops: the layout makes it
    pending again, as the trigger would have, and the cluster's claim then admits it under its limit."""
    with citus_cluster(workers=1, shard_count=4) as cluster:
        env = dict(
            os.environ,
            DATABASE_URL=cluster.url,
            DURABLERUNS_TEST_CITUS="1",
            DJANGO_SETTINGS_MODULE="project.settings",
            DURABLERUNS_WORKFLOW_MODULES="tests.workflows",
            TEST_LIMITED_SECONDS="0.01",
        )

        def manage(*args: str) -> subprocess.CompletedProcess[str]:
            done = subprocess.run(
                [sys.executable, "manage.py", *args, "--skip-checks"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr
            return done

        manage("migrate", "-v0")
        start = (
            "import django; django.setup(); import durableruns; [durableruns.start('limited', {'n': n}, "
            "run_id=f'l{n}') for n in range(5)]"
        )
        subprocess.run([sys.executable, "-c", start], cwd=ROOT, env=env, check=True, timeout=120)
        # Two parked as the single node's claim parks them (waiting, no wake time, the reason), three pending.
        cluster.coordinator.query(
            "UPDATE run_state SET status = 'waiting', reason = %s, wake_at = NULL WHERE run_id IN ('l3', 'l4')",
            [PARKED],
        )
        manage("distribute_runs")
        # The debounce key's unique index (a key without run_id) became a plain one on the same runs.
        indexes = cluster.coordinator.query(
            "SELECT to_regclass('run_state_debounce_key_uniq') IS NULL, "
            "to_regclass('run_state_debounce_key_idx') IS NULL"
        )
        assert indexes == [(True, False)]
        states = dict(cluster.coordinator.query("SELECT run_id, status FROM run_state"))
        assert states == {f"l{n}": "pending" for n in range(5)}, states
        manage("resume_runs", "--once", "--concurrency", "4")
        assert cluster.coordinator.query("SELECT count(*) FROM run_state WHERE status = 'completed'") == [(5,)]
