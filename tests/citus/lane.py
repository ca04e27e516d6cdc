"""The Citus lane: `python -m tests.citus.lane [pytest arguments]` starts a private cluster (tests/citus/cluster.py:
a coordinator and two workers), migrates the demo site into it, lays the record out with `manage.py
distribute_runs`, and runs pytest against the coordinator (DATABASE_URL, DURABLERUNS_TEST_CITUS=1: the suite then
uses that database as it is, tests/conftest.py); the cluster is stopped and removed afterwards whatever happens.
Without arguments it runs the lane bin/test runs: tests/citus, the core that touches the database and the
integration tests.
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

# What the lane runs by default (bin/test): the Citus tests, then the core and the integration tests, whose
# every worker process claims and writes through the coordinator.
DEFAULT = ["tests/citus", "tests/unit", "tests/integration", "--deselect", "tests/unit/test_typing.py"]


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
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *(argv or DEFAULT)], cwd=ROOT, env=env
        )
    print(f"(the Citus lane took {time.monotonic() - started:.0f} s)", flush=True)
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
